"""A rank worker: one rank of the replica in a process of its own, on its own device,
in one torch.distributed process group with the other ranks.

    python -m runtime.executor.rank_worker --config JSON --rank R --local-rank L
        [--core ADDR] [--parent PID]

It holds the dense weights (replicated), its own routed experts, its own pool shards and
MTP slots, and runs a ModelRunner over that one rank. Rank 0 takes each step's Plan from
the engine core (--core: a ZMQ PAIR address; runtime/executor/workers.py) and broadcasts
its bytes to the others over a gloo control group: a length, then a uint8 tensor. Every
rank's PlanReader (runtime/executor/step_plan.py) applies the Plan to its mirrors of the
requests and rebuilds the rank's share of the step; every rank runs it (the MoE's tokens
cross ranks through all-to-all, runtime/backends/compiled/expert_parallel.py), encodes
its results, and rank 0 gathers them (lengths all-gathered, then padded uint8 tensors)
and sends one Reply back. Every message is a typed msgspec one (plan_messages.py): no
object is pickled, on the socket or in a collective. While the core has no step to send,
rank 0 broadcasts a Heartbeat every HEARTBEAT_S, so that a rank that stops answering
fails the group within --distributed-timeout rather than never.

A rank exits when the core sends Shutdown, when a collective fails (a peer died or
timed out: it reports the error and exits 1), or when its parent process does.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist
import zmq

import generated
from runtime.backends.compiled import expert_parallel
from runtime.core.config import EngineConfig
from runtime.device.model_runner import ModelRunner
from runtime.executor.executor import backend_name
from runtime.executor.parent_watch import die_with_parent
from runtime.executor.plan_messages import (
    Dead,
    Heartbeat,
    Plan,
    RankInfo,
    Ready,
    Reply,
    Result,
    Shutdown,
    ToRanks,
    result_message,
)
from runtime.executor.step_plan import PlanReader
from runtime.planning.admission import Admission
from runtime.weights.loader import bytes_per_rank, load_params

log = logging.getLogger("v4serve.worker")
HEARTBEAT_S = 1.0


def device_of(kind: str, local_rank: int) -> torch.device:
    """cuda:i / npu:i for the i-th rank of a node; cpu for every rank on a cpu."""
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, local_rank)


def select(device: torch.device) -> None:
    """Make `device` the process's current one (cuda, or npu with torch_npu): NCCL and HCCL
    run a rank's collectives on the current device, where its tensors must be."""
    if device.type != "cpu":
        torch.get_device_module(device).set_device(device)


def process_group_backend(kind: str) -> str:
    return {"cuda": "nccl", "npu": "hccl"}.get(kind, "gloo")


class RankWorker:
    def __init__(self, config: EngineConfig, rank: int, local_rank: int):
        spec = generated.load(config.spec)
        kind = config.device or spec.contract.DEVICE
        self.rank, self.device = rank, device_of(kind, local_rank)
        select(self.device)
        dist.init_process_group(
            process_group_backend(kind), rank=rank, world_size=spec.contract.RANKS,
            init_method=f"tcp://{config.master_addr}:{config.master_port}",
            timeout=datetime.timedelta(seconds=config.distributed_timeout))
        # plans and results travel as msgpack bytes in uint8 tensors on the host: over
        # gloo, whatever the device's backend
        self.control = dist.group.WORLD if kind == "cpu" else dist.new_group(backend="gloo")
        expert_parallel.enable(dist.group.WORLD)
        admission = Admission.plan(config, spec)
        self.params = load_params(config.model, spec, device=self.device,
                                  held=range(rank, rank + 1))
        admission.check_weights(bytes_per_rank(self.params))     # before the pools
        self.runner = ModelRunner(spec, self.params, admission.capacity.blocks, admission.k,
                                  backend_name(config, spec), self.device, ranks=1,
                                  max_logprobs=config.max_logprobs,
                                  checkpoint=Path(config.model),
                                  defer_compile=config.defer_compile,
                                  adaptive=admission.adaptive)
        self.pool_bytes = admission.capacity.bytes
        self.reader = PlanReader(rank)
        self.encoder = msgspec.msgpack.Encoder()

    def info(self) -> RankInfo:
        """This rank, for /server_info and the startup log."""
        graphs = self.runner.graphs()
        return RankInfo(self.rank, os.getpid(), os.uname().nodename, str(self.device),
                        bytes_per_rank(self.params), self.pool_bytes,
                        graphs.pending() if graphs is not None else 0)

    def warmup(self) -> None:
        """Every rank runs the same warm-up launches, so their collectives pair; only a
        compiling backend has anything to warm up."""
        if self.runner.compiles():
            self.runner.warmup()

    def step(self, plan: Plan) -> bytes:
        """This rank's share of the step, run: its requests' Results, encoded."""
        share = self.reader.take(plan)
        for request_id in share.forget:
            self.runner.forget(request_id)
        results = self.runner.execute(share.out, share.extents)
        return self.encoder.encode([result_message(self.reader.handle(request), result)
                                    for request, result in results.items()])

    def reply(self, parts: list[bytes]) -> Reply:
        """Rank 0: every rank's results and its own time and dispatch counts."""
        results = [r for part in parts for r in msgspec.msgpack.decode(part, type=list[Result])]
        t = self.runner.timing
        return Reply(results, (t.marshal, t.kernel, t.sample), dict(self.runner.dispatches))

    def broadcast(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank: its length, then its bytes as a uint8 tensor."""
        size = torch.tensor([len(data) if self.rank == 0 else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.control)
        box = _tensor(data) if self.rank == 0 else torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(box, src=0, group=self.control)
        return box.numpy().tobytes()

    def gather(self, data: bytes) -> list[bytes] | None:
        """Every rank's `data`, on rank 0 (None elsewhere): the lengths all-gathered, then
        each rank's bytes padded to the longest, gathered."""
        ranks = dist.get_world_size(self.control)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(ranks)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.control)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:len(data)] = _tensor(data)
        boxes = [torch.empty(longest, dtype=torch.uint8) for _ in range(ranks)] \
            if self.rank == 0 else None
        dist.gather(padded, boxes, dst=0, group=self.control)
        if boxes is None:
            return None
        return [box[:int(n)].numpy().tobytes() for box, n in zip(boxes, sizes)]


def _tensor(data: bytes) -> torch.Tensor:
    """[len(data)] uint8, a copy (frombuffer takes neither read-only nor empty buffers)."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def serve(worker: RankWorker, core: zmq.Socket | None) -> None:
    """The step loop: rank 0 relays messages from the core (core is its socket), the
    others follow. Returns on Shutdown."""
    encode, decoder = worker.encoder.encode, msgspec.msgpack.Decoder(ToRanks)
    worker.warmup()                                  # then its info counts what waits
    infos = worker.gather(encode(worker.info()))
    if core is not None:
        core.send(encode(Ready([msgspec.msgpack.decode(i, type=RankInfo) for i in infos])))
    heartbeat = encode(Heartbeat())
    while True:
        data = heartbeat
        if core is not None and core.poll(int(HEARTBEAT_S * 1000)):
            data = core.recv()
        message = decoder.decode(worker.broadcast(data))    # rank 0's, on every rank
        if isinstance(message, Shutdown):
            return
        if isinstance(message, Heartbeat):
            continue
        parts = worker.gather(worker.step(message))
        if core is not None:
            core.send(encode(worker.reply(parts)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.executor.rank_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="EngineConfig fields as JSON")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--local-rank", type=int, required=True)
    parser.add_argument("--core", default=None, help="rank 0: the core's ZMQ PAIR address")
    parser.add_argument("--parent", type=int, default=None, help="exit when this pid does")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent(args.parent)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(levelname)s rank {args.rank} %(name)s: %(message)s")
    context = zmq.Context()
    core = None
    if args.core is not None:
        core = context.socket(zmq.PAIR)
        core.setsockopt(zmq.LINGER, 1000)
        core.connect(args.core)
    try:
        serve(RankWorker(EngineConfig(**json.loads(args.config)), args.rank, args.local_rank),
              core)
        return 0
    except Exception as exc:  # noqa: BLE001 - reported, then the whole group goes
        log.exception("rank %d failed", args.rank)
        if core is not None:
            core.send(msgspec.msgpack.encode(
                Dead(f"rank {args.rank}: {type(exc).__name__}: {exc}")))
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        context.destroy(linger=1000)


if __name__ == "__main__":
    sys.exit(main())
