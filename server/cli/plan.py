"""`v4serve plan`: how many tokens a spec's cache holds on a device, from the spec alone
(runtime/planning/plan_report.py computes and renders the figures)."""
from __future__ import annotations

import argparse
import json
import sys

from runtime.planning.plan_report import plan, render
from server.cli.engine_args import add_limit_args, add_memory_args, limit_fields


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", help="how many tokens a spec's cache holds on a device, from the spec alone",
        description="Weights per rank by kind, cache pool bytes per group, tokens per rank "
                    "and the requests of --max-model-len tokens that run at once, for one "
                    "replica of the spec on devices of --device-memory each; or how much "
                    "memory is missing; for a V4.1 spec, its Engram tables' bytes per rank "
                    "and per node and what they leave the cache in each --engram-placement. "
                    "Exit status 1 when it does not fit.")
    add_limit_args(parser)
    add_memory_args(parser, required=True)
    parser.add_argument("--ranks", type=_positive, default=None,
                        help="ranks of the replica, one device each; the routed experts "
                             "split over them (default: the spec's)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of ranks")
    return value


def run(args: argparse.Namespace) -> int:
    from runtime.core.config import EngineConfig
    from server.cli.spec_check import StaleSpecError, served

    try:
        spec = served(args.spec, args.kv_cache_dtype)
    except StaleSpecError as exc:
        print(f"v4serve plan: {exc}", file=sys.stderr)
        return 2
    config = EngineConfig(**limit_fields(args), device_memory=args.device_memory,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          engram_placement=args.engram_placement)
    result = plan(config, spec, args.ranks)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0 if result["fits"] else 1
