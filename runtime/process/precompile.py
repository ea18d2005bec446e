"""Compile every graph a configuration needs and save it, then exit:

    python -m runtime.backends.compiled.precompile --spec tiny [--model DIR]
        [--num-speculative-tokens K] [--device cpu]

`v4serve compile` runs this; `v4serve serve` runs it in the background when graphs are
missing, and serves eagerly until each one is saved (graphs.py picks them up).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

from runtime.engine.engine import Engine, EngineConfig


def compile_all(config: EngineConfig) -> dict[str, float]:
    """Build an engine for `config` and run its warmup with compiling graphs."""
    engine = Engine.build(config)
    return engine.warmup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.backends.compiled.precompile",
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
