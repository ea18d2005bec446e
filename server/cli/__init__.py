"""The `v4serve` command, the one place every subcommand is registered: one subcommand
per stage of the pipeline, each defined by a module of this package (codegen's by
codegen/cli.py, which `python -m codegen` also runs).

    codegen, spec new   specs -> generated/          codegen/cli.py
    plan                a spec's capacity on a device plan.py
    rehearse            a spec's launches, fake tensors rehearse.py
    compile             the compiled backend's graphs compile_graphs.py
    generate            offline generation            generate.py
    serve               the OpenAI-compatible server  serve.py

Every subcommand but codegen's shares the engine flags of engine_args.py. Building this
parser imports neither torch nor pydantic, so `v4serve --help` (and any subcommand's
help) answers at once; a subcommand imports what it runs.
"""
from __future__ import annotations

import argparse

from codegen import cli as codegen_cli
from server.cli import compile_graphs, generate, plan, rehearse, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="v4serve", description="Serve DeepSeek V4 models from declarative specs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    codegen_cli.add_parser(sub)
    codegen_cli.add_spec_parser(sub)
    generate.add_parser(sub)
    compile_graphs.add_parser(sub)
    plan.add_parser(sub)
    rehearse.add_parser(sub)
    serve.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
