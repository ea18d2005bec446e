"""The `v4serve` command: one subcommand per stage of the pipeline, each defined by the
module that owns the stage. Building this parser imports neither torch nor pydantic, so
`v4serve --help` (and any subcommand's help) answers at once; a subcommand imports what
it runs."""
from __future__ import annotations

import argparse
import sys

from codegen import cli as codegen_cli
from runtime import cli as runtime_cli
from runtime.planning import plan_report
from server import cli as server_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="v4serve", description="Serve DeepSeek V4 models from declarative specs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    codegen_cli.add_parser(sub)
    codegen_cli.add_spec_parser(sub)
    runtime_cli.add_parser(sub)
    runtime_cli.add_compile_parser(sub)
    plan_report.add_parser(sub)
    server_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
