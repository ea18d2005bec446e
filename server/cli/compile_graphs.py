"""`v4serve compile`: compile and save every graph the engine flags need, so that serve
and generate start with compiled graphs."""
from __future__ import annotations

import argparse

from server.cli.engine_args import engine_command, engine_config
from server.cli.spec_check import StaleSpecError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = engine_command(
        subparsers, "compile", "compile and save every graph of a spec's compiled backend",
        "Compile every graph the engine flags need and save it under V4SERVE_CACHE_DIR "
        "(default ~/.cache/v4serve), so that serve and generate start with compiled graphs.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import subprocess

    from runtime.process.precompile import precompile_command

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = engine_config(args)
    except StaleSpecError as exc:
        raise SystemExit(f"v4serve: {exc}") from None
    return subprocess.call(precompile_command(config))
