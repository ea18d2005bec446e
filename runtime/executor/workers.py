"""The ranks as worker processes (--distributed-executor-backend mp), seen by the engine
as its model runner: execute(step) -> each request's result.

The engine process starts this node's ranks (runtime/executor/rank_worker.py, one process each,
ranks node_rank * per_node ...), every one dying with it; the ranks of the other nodes
are started there by the same command with --node-rank (run_node). All ranks meet in one
torch.distributed group at master_addr:master_port, torchrun style. The engine talks to
rank 0 alone, over a ZMQ PAIR socket: a pickled Plan per step out, a Reply back (rank 0
broadcasts and gathers over the group).

Faults: while it waits, the engine watches its ranks' processes. A rank that exits (or
a Reply that says a rank failed) fails the engine at once with WorkerDied, and every
rank of this node is killed; the other nodes' ranks fail their next collective (or
time out, --distributed-timeout) and exit.
"""
from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import asdict, replace

import zmq

from runtime.core.request import Request
from runtime.core.scheduler import SchedulerOutput
from runtime.device.launch_inputs import prefill_extents
from runtime.device.step_result import StepResult, Timing
from runtime.executor.parent_watch import arm_death_signal
from runtime.executor.step_plan import Plan, Reply
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
        self._forget: list[str] = []
        try:
            self.ranks = self._receive("ready")
        except BaseException:
            self.close()
            raise

    def execute(self, out: SchedulerOutput) -> dict[Request, StepResult]:
        """Run one step on every rank; the results by request."""
        plan = Plan(out, prefill_extents(self.contract, out.prefill_launches()),
                    self._forget)
        self._forget = []
        self.socket.send(pickle.dumps(plan))
        reply: Reply = self._receive("step")
        self.timing = Timing(*reply.timing)
        self.dispatches = Counter(reply.dispatches)
        by_id = {r.request_id: r for launch in out.decode for r in launch}
        by_id.update((ch.request.request_id, ch.request) for ch in out.prefill)
        return {by_id[i]: result for i, result in reply.results.items()}

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

    def rank_processes(self) -> list[dict]:
        return self.ranks

    def param_bytes_per_rank(self) -> int:
        return max(r["param_bytes"] for r in self.ranks)

    def resident(self) -> dict[str, int]:
        """Nothing here: the rank processes hold the weights and pools."""
        return {"resident_weight_bytes": 0, "resident_pool_bytes": 0}

    def _receive(self, kind: str):
        """The next message from rank 0, of `kind`; WorkerDied if a rank of this node
        exits first or rank 0 reports a failure."""
        while not self.socket.poll(POLL_MS):
            for rank, p in enumerate(self.processes):
                if p.poll() is not None:
                    raise WorkerDied(f"rank worker {rank} (pid {p.pid}) exited with "
                                     f"code {p.returncode}")
        got, body = pickle.loads(self.socket.recv())
        if got == "dead":
            raise WorkerDied(body)
        if got != kind:
            raise WorkerDied(f"rank 0 sent {got!r} where {kind!r} was due")
        return body

    def close(self) -> None:
        """Shut every rank down (politely if rank 0 still listens), then reap them."""
        if all(p.poll() is None for p in self.processes):
            try:
                self.socket.send(pickle.dumps(None), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
                time.sleep(0.05)
        stop(self.processes)
        self.context.destroy(linger=0)
