"""The ranks as worker processes (--distributed-executor-backend mp), seen by the engine
as its model runner: execute(step) -> each request's result.

The engine process starts this node's ranks (runtime/executor/rank_worker.py, one process each,
ranks node_rank * per_node ...), every one dying with it; the ranks of the other nodes
are started there by the same command with --node-rank (run_node). All ranks meet in one
torch.distributed group at master_addr:master_port, torchrun style. The engine talks to
rank 0 alone, over a ZMQ PAIR socket, in typed msgpack messages (plan_messages.py; no
pickle anywhere: whatever reaches the port decodes into plain data or fails):

    engine -> rank 0   a Plan per step: only what changed since the ranks last saw the
                       step's requests (a PlanWriter, step_plan.py: a prompt once, then
                       new tokens, blocks and placements; a decode row costs a few bytes,
                       whatever its context); Shutdown on close
    rank 0 -> engine   Ready once (every rank's RankInfo), a Reply per Plan (each
                       request's Result under its handle, rank 0's timing and dispatch
                       counts), or Dead

Rank 0 broadcasts each Plan to the other ranks and gathers their results over the group
(rank_worker.py). A request's own failure on a rank comes back as its type name and text,
rebuilt here as an exception that reads the same (plan_messages.rebuilt).

Faults: while it waits, the engine watches its ranks' processes. A rank that exits (or
a Dead message: a rank failed) fails the engine at once with WorkerDied, and every rank
of this node is killed; the other nodes' ranks fail their next collective (or time out,
--distributed-timeout) and exit.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import asdict, replace

import msgspec
import zmq

from runtime.core.request import Request
from runtime.core.scheduler import SchedulerOutput
from runtime.device.launch_inputs import prefill_extents
from runtime.device.step_result import StepResult, Timing
from runtime.executor.parent_watch import arm_death_signal
from runtime.executor.plan_messages import (
    Dead,
    FromRanks,
    Ready,
    Reply,
    Shutdown,
    step_result,
)
from runtime.executor.step_plan import PlanWriter
from runtime.text.grammar import StructuredOutputs

POLL_MS = 100


class WorkerDied(RuntimeError):
    """A rank process exited or failed: the engine cannot go on."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve(config):
    """The config with a master port chosen (a free one when a single node runs every
    rank and none was given)."""
    if config.master_port:
        return config
    if config.nnodes > 1:
        raise ValueError("--master-port is needed with --nnodes > 1 (every node must "
                         "name the same one)")
    return replace(config, master_port=free_port())


def node_ranks(ranks: int, nnodes: int, node_rank: int) -> range:
    """The ranks node `node_rank` runs: ranks per node = ranks / nnodes."""
    if nnodes < 1 or ranks % nnodes:
        raise ValueError(f"--nnodes {nnodes} must divide the spec's {ranks} ranks")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} must be in 0..{nnodes - 1}")
    per = ranks // nnodes
    return range(node_rank * per, (node_rank + 1) * per)


def start_ranks(config, ranks: range, core: str | None) -> list[subprocess.Popen]:
    """One process per rank of `ranks`, each dying with this one; rank 0 (if here)
    connects to `core`."""
    per_node = len(ranks)
    threads = config.worker_threads or max(1, (os.cpu_count() or 1) // per_node)
    body = json.dumps(asdict(config), default=str)
    processes = []
    for local, rank in enumerate(ranks):
        command = [sys.executable, "-m", "runtime.executor.rank_worker", "--config", body,
                   "--rank", str(rank), "--local-rank", str(local),
                   "--parent", str(os.getpid()), "--threads", str(threads)]
        if rank == 0 and core is not None:
            command += ["--core", core]
        processes.append(subprocess.Popen(command, preexec_fn=arm_death_signal))
    return processes


def stop(processes: list[subprocess.Popen], grace: float = 5.0) -> None:
    """Terminate, then kill what is left after `grace` seconds; reap every one."""
    for p in processes:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_node(config) -> int:
    """A node other than 0: run its ranks until they exit; the first failure ends all."""
    spec_ranks = _spec_ranks(config)
    processes = start_ranks(config, node_ranks(spec_ranks, config.nnodes, config.node_rank),
                            None)
    try:
        while True:
            codes = [p.poll() for p in processes]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                return max(c or 0 for c in codes)
            time.sleep(POLL_MS / 1000)
    finally:
        stop(processes)


def _spec_ranks(config) -> int:
    import generated

    return generated.load(config.spec).contract.RANKS


class Workers:
    """This node's rank processes and the link to rank 0: an Executor
    (runtime/executor/executor.py) whose ranks warm up, compile and hold their weights
    and pools in their own processes."""

    def __init__(self, config, contract):
        self.config, self.contract = resolve(config), contract
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        mine = node_ranks(contract.RANKS, self.config.nnodes, 0)
        self.processes = start_ranks(self.config, mine, f"tcp://127.0.0.1:{port}")
        self.timing, self.dispatches = Timing(), Counter()
        self.device = self.config.device or "per rank"
        self.writer, self._forget = PlanWriter(), []
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromRanks)
        try:
            ready: Ready = self._receive(Ready)
            self.ranks = [msgspec.structs.asdict(info) for info in ready.ranks]
        except BaseException:
            self.close()
            raise

    def execute(self, out: SchedulerOutput) -> dict[Request, StepResult]:
        """Run one step on every rank; the results by request."""
        extents = prefill_extents(self.contract, out.prefill_launches())
        self.socket.send(self.writer.write(out, extents, self._forget))
        self._forget = []
        reply: Reply = self._receive(Reply)
        self.timing = Timing(*reply.timing)
        self.dispatches = Counter(reply.dispatches)
        return {self.writer.request(r.handle): step_result(r) for r in reply.results}

    def forget(self, request_id: str) -> None:
        self._forget.append(request_id)

    def prepare(self, constraint: StructuredOutputs) -> Future:
        """Nothing ahead of the step here (a done future): the rank that runs a
        constrained request compiles its grammar when it first masks it, once per rank
        process (its vocabulary keeps compiled grammars)."""
        done: Future = Future()
        done.set_result(None)
        return done

    def adopt(self, request: Request, prepared) -> None:
        """Nothing to hand over: the rank compiles for itself."""

    def compiles(self) -> bool:
        """Nothing compiles here: each rank warmed up before it reported ready."""
        return False

    def warmup(self) -> None:
        """Done: the ranks warm up before they report ready."""

    def graphs(self) -> None:
        return None

    def pending_graphs(self) -> int:
        """The most graphs any rank runs eagerly for want of an artifact (counted after
        its warmup; a rank picks each up as it is saved)."""
        return max(r["pending_graphs"] for r in self.ranks)

    def rank_processes(self) -> list[dict]:
        return self.ranks

    def param_bytes_per_rank(self) -> int:
        return max(r["param_bytes"] for r in self.ranks)

    def resident(self) -> dict[str, int]:
        """Nothing here: the rank processes hold the weights and pools."""
        return {"resident_weight_bytes": 0, "resident_pool_bytes": 0}

    def _receive(self, kind: type):
        """The next message from rank 0, of `kind`; WorkerDied if a rank of this node
        exits first or rank 0 reports a failure."""
        while not self.socket.poll(POLL_MS):
            for rank, p in enumerate(self.processes):
                if p.poll() is not None:
                    raise WorkerDied(f"rank worker {rank} (pid {p.pid}) exited with "
                                     f"code {p.returncode}")
        got = self._decoder.decode(self.socket.recv())
        if isinstance(got, Dead):
            raise WorkerDied(got.error)
        if not isinstance(got, kind):
            raise WorkerDied(f"rank 0 sent {type(got).__name__} where {kind.__name__} was due")
        return got

    def close(self) -> None:
        """Shut every rank down (politely if rank 0 still listens), then reap them."""
        if all(p.poll() is None for p in self.processes):
            try:
                self.socket.send(self._encoder.encode(Shutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
                time.sleep(0.05)
        stop(self.processes)
        self.context.destroy(linger=0)
