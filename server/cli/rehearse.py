"""`v4serve rehearse`: run one rank of a spec's replica at full size on fake tensors, every
launch kind at its largest shapes, and print each launch's peak workspace (runtime/device/
rehearsal.py). Exit status 1 when a launch fails."""
from __future__ import annotations

import argparse
import json
import sys

from server.cli.engine_args import positive_int
from server.cli.spec_check import load_current


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rehearse", help="run a spec's launches at full size on fake tensors: no memory, "
                         "no device; peak workspace per launch",
        description="Build one rank of the spec's replica with fake weights of the "
                    "release's shapes and dtypes, fake pools and a fake process group of "
                    "the spec's ranks, run every launch kind at its largest shapes and "
                    "print the peak memory each allocates beyond weights and pools.")
    parser.add_argument("--spec", default="tiny", help="spec, by name or file (default: tiny)")
    parser.add_argument("--device", choices=("cuda", "npu", "cpu"), default="cuda",
                        help="the fake device the rank's tensors stand on (default: cuda)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="the largest K rehearsed (default: the spec's)")
    parser.add_argument("--ranks", type=positive_int, default=None,
                        help="ranks of the replica, the routed experts split over them "
                             "(default: the spec's)")
    parser.add_argument("--rank", type=int, default=0, help="the rank played (default: 0)")
    parser.add_argument("--prefill-extent", type=positive_int, default=None,
                        help="rows per slot of the main prefill (default: the spec's max "
                             "extent; a fake launch walks it tile by tile, ~4 min per 1,024 "
                             "rows of V4-Flash here)")
    parser.add_argument("--contexts", default=None,
                        help="comma-separated contexts of the decode launches (default: the "
                             "spec's context buckets)")
    parser.add_argument("--json", action="store_true", help="one JSON object per launch")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from runtime.device.rehearsal import Rehearsal

    spec = load_current(args.spec)
    contexts = tuple(int(c) for c in args.contexts.split(",")) if args.contexts else None
    try:
        rehearsal = Rehearsal(spec, args.rank, args.num_speculative_tokens, args.device,
                              args.ranks)
    except ValueError as exc:
        print(f"v4serve rehearse: {exc}", file=sys.stderr)
        return 2
    failed = 0
    if not args.json:
        print(f"spec {spec.SPEC_NAME}: rank {args.rank} of {rehearsal.ranks} on a fake "
              f"{args.device}, K up to "
              f"{rehearsal.k}; peak workspace per launch (weights and pools aside)")
    for done in rehearsal.launches(args.prefill_extent, contexts):
        failed += done.error is not None
        print(json.dumps(asdict(done)) if args.json else _line(done), flush=True)
    return 1 if failed else 0


def _line(done) -> str:
    what = f"{done.kernel:<14} context {done.context or '-':>8}  rows {done.rows:>6}"
    if done.error:
        return f"{what}  FAILED: {done.error.splitlines()[0]}"
    return f"{what}  peak {done.peak_bytes / 2**30:8.2f} GiB  ({done.seconds:.0f} s)"
