"""Compile every graph a configuration needs and save it, then exit:

    python -m runtime.process.precompile --spec tiny [--model DIR]
        [--num-speculative-tokens K] [--device cpu]

`v4serve compile` runs this; a serving engine (in the engine-core process or in the
server's) starts it in the background when graphs are missing, and serves eagerly until
each one is saved (graphs.py picks them up).
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

from runtime.core.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.executor.parent_watch import arm_death_signal

log = logging.getLogger("v4serve")


def precompile_command(config: EngineConfig) -> list[str]:
    """The command that compiles and saves every graph of this engine configuration."""
    command = [sys.executable, "-m", "runtime.process.precompile", "--spec", config.spec,
               "--model", str(config.model)]
    if config.num_speculative_tokens is not None:
        command += ["--num-speculative-tokens", str(config.num_speculative_tokens)]
    if config.device:
        command += ["--device", config.device]
    return command


def compile_missing(engine: Engine) -> subprocess.Popen | None:
    """After warmup: start compiling the graphs that have no artifact yet in a background
    process (which dies with this one), or None when every graph is there."""
    pending = engine.pending_graphs()
    if not pending:
        return None
    process = subprocess.Popen(precompile_command(engine.config), preexec_fn=arm_death_signal)
    log.info("%d graph(s) are not compiled yet: compiling them in the background (pid %d); "
             "they run eagerly meanwhile", pending, process.pid)
    return process


def compile_all(config: EngineConfig) -> dict[str, float]:
    """Build an engine for `config` and run its warmup with compiling graphs."""
    engine = Engine.build(config)
    return engine.warmup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.process.precompile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny")
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    seconds = compile_all(EngineConfig(
        spec=args.spec, model=args.model, num_speculative_tokens=args.num_speculative_tokens,
        device=args.device, backend="compiled", max_model_len=1024))   # small pools:
    # a graph's page count is dynamic, so it serves every capacity
    logging.getLogger("v4serve.graphs").info(
        "%d graphs ready in %.1f s", len(seconds), time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
