"""A rank worker: one rank of the replica in a process of its own, on its own device,
in one torch.distributed process group with the other ranks.

    python -m runtime.executor.rank_worker --config JSON --rank R --local-rank L
        [--core ADDR] [--parent PID]

It holds the dense weights (replicated), its own routed experts, its own pool shards and
MTP slots, and runs a ModelRunner over that one rank. Rank 0 takes each step's plan from
the engine core (--core: a ZMQ PAIR address; runtime/executor/workers.py) and broadcasts it to the
others over the group; every rank runs the step on its own requests (the MoE's tokens
cross ranks through all-to-all, runtime/backends/compiled/expert_parallel.py), and rank 0
gathers the results and sends them back. While the core has no step to send, rank 0
broadcasts a heartbeat every HEARTBEAT_S, so that a rank that stops answering fails
the group within --distributed-timeout rather than never.

A rank exits when the core sends None (shutdown), when a collective fails (a peer died or
timed out: it reports the error and exits 1), or when its parent process does.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import zmq

import generated
from runtime.backends.compiled import expert_parallel
from runtime.core.config import EngineConfig
from runtime.device.model_runner import ModelRunner
from runtime.device.step_result import StepResult
from runtime.executor.executor import backend_name
from runtime.executor.parent_watch import die_with_parent
from runtime.executor.step_plan import Plan, Reply, localize
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
        # plans and results travel as objects: over gloo, whatever the device's backend
        self.control = dist.group.WORLD if kind == "cpu" else dist.new_group(backend="gloo")
        expert_parallel.enable(dist.group.WORLD)
        admission = Admission.plan(config, spec)
        self.params = load_params(config.model, spec, device=self.device,
                                  held=range(rank, rank + 1))
        admission.check_weights(bytes_per_rank(self.params))     # before the pools
        self.runner = ModelRunner(spec, self.params, admission.capacity.blocks, admission.k,
                                  backend_name(config, spec), self.device, ranks=1,
                                  max_logprobs=config.max_logprobs,
                                  checkpoint=Path(config.model))
        self.pool_bytes = admission.capacity.bytes

    def info(self) -> dict:
        """This rank, for /server_info and the startup log."""
        return {"rank": self.rank, "pid": os.getpid(), "host": os.uname().nodename,
                "device": str(self.device), "param_bytes": bytes_per_rank(self.params),
                "pool_bytes": self.pool_bytes}

    def warmup(self) -> None:
        """Every rank runs the same warm-up launches, so their collectives pair; only a
        compiling backend has anything to warm up."""
        if self.runner.compiles():
            self.runner.warmup()

    def step(self, plan: Plan) -> dict[str, StepResult]:
        for request_id in plan.forget:
            self.runner.forget(request_id)
        results = self.runner.execute(localize(plan.out, self.rank), plan.extents)
        return {request.request_id: result for request, result in results.items()}

    def gather(self, value):
        """Every rank's `value`, on rank 0 (None elsewhere)."""
        out = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.control)
        return out

    def broadcast(self, value):
        """Rank 0's `value` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


def serve(worker: RankWorker, core: zmq.Socket | None) -> None:
    """The step loop: rank 0 relays plans from the core (core is its socket), the
    others follow. Returns on shutdown."""
    infos = worker.gather(worker.info())
    worker.warmup()
    if core is not None:
        core.send(pickle.dumps(("ready", infos)))
    while True:
        plan = "heartbeat"
        if core is not None and core.poll(int(HEARTBEAT_S * 1000)):
            plan = pickle.loads(core.recv())
        plan = worker.broadcast(plan)             # rank 0's; the others' value is dropped
        if plan is None:
            return
        if plan == "heartbeat":
            continue
        results = worker.gather(worker.step(plan))
        if core is not None:
            merged = {k: v for part in results for k, v in part.items()}
            t = worker.runner.timing
            core.send(pickle.dumps(("step", Reply(
                merged, (t.marshal, t.kernel, t.sample), dict(worker.runner.dispatches)))))


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
            core.send(pickle.dumps(("dead", f"rank {args.rank}: {type(exc).__name__}: {exc}")))
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        context.destroy(linger=1000)


if __name__ == "__main__":
    sys.exit(main())
