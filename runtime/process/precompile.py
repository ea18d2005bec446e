"""Compile every graph a configuration needs and save it, then exit:

    python -m runtime.process.precompile --spec tiny [--model DIR]
        [--num-speculative-tokens K] [--speculative-policy adaptive] [--device cpu]
        [--distributed-executor-backend mp]

Without --num-speculative-tokens, the graphs of every K the spec declares (and this
runtime serves), so that a later run at any K finds them. With mp, the rank processes'
graphs (each holds its share of the experts): they compile each graph once between
them (graphs.py's lock). `v4serve compile` runs this; a serving engine (in the
engine-core process or in the server's) starts it in the background for its own K when
graphs are missing, and serves eagerly until each one is saved (graphs.py picks them
up).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import subprocess
import sys
import time

import generated
from runtime.core.config import EngineConfig
from runtime.core.speculation import POLICIES
from runtime.engine.engine import Engine
from runtime.executor.parent_watch import arm_death_signal
from runtime.planning.admission import servable_ks

log = logging.getLogger("v4serve")


def precompile_command(config: EngineConfig, k: int | None = None) -> list[str]:
    """The command that compiles and saves every graph of this engine configuration, at
    K = `k` (None: the configuration's K if it names one, else every K)."""
    command = [sys.executable, "-m", "runtime.process.precompile", "--spec", config.spec,
               "--model", str(config.model),
               "--distributed-executor-backend", config.distributed_executor_backend]
    k = config.num_speculative_tokens if k is None else k
    if k is not None:
        command += ["--num-speculative-tokens", str(k)]
    if config.speculative_policy != "fixed":     # the fused graphs of every K up to k
        command += ["--speculative-policy", config.speculative_policy]
    if config.device:
        command += ["--device", config.device]
    return command


def compile_missing(engine: Engine) -> subprocess.Popen | None:
    """After warmup: start compiling the graphs that have no artifact yet in a background
    process (which dies with this one), or None when every graph is there."""
    pending = engine.pending_graphs()
    if not pending:
        return None
    process = subprocess.Popen(precompile_command(engine.config, engine.k),
                               preexec_fn=arm_death_signal)
    log.info("%d graph(s) are not compiled yet: compiling them in the background (pid %d); "
             "they run eagerly meanwhile", pending, process.pid)
    return process


def compile_all(config: EngineConfig) -> dict[str, float]:
    """Build an engine for `config` at its K (every K the spec serves if it names none)
    and run its warmup with compiling graphs; seconds per graph of this process."""
    ks = [config.num_speculative_tokens]
    if ks == [None]:
        ks = servable_ks(generated.load(config.spec).contract)
    seconds: dict[str, float] = {}
    for k in ks:
        engine = Engine.build(dataclasses.replace(config, num_speculative_tokens=k))
        try:
            seconds.update(engine.warmup())
        finally:
            engine.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.process.precompile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny")
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--speculative-policy", choices=POLICIES, default="fixed")
    parser.add_argument("--device", default=None)
    parser.add_argument("--distributed-executor-backend", choices=("uni", "mp"),
                        default="uni")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    # small pools (max_model_len): a graph's page count is dynamic, so it serves every
    # capacity
    seconds = compile_all(EngineConfig(
        spec=args.spec, model=args.model, num_speculative_tokens=args.num_speculative_tokens,
        speculative_policy=args.speculative_policy, device=args.device, backend="compiled",
        max_model_len=1024,
        distributed_executor_backend=args.distributed_executor_backend))
    logging.getLogger("v4serve.graphs").info(
        "%d graphs ready in %.1f s", len(seconds), time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
