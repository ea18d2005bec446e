"""`v4serve serve` until the HTTP server lands: loads the spec's generated package,
prints what it would serve, and says plainly on stderr that no server runs yet."""
from __future__ import annotations

import argparse
import sys

import generated


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a spec over HTTP (placeholder: the server is not built yet)")
    parser.add_argument("--spec", default="tiny", help="generated spec to serve (default: tiny)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    package = generated.load(args.spec)
    c = package.contract
    layouts = ", ".join(f"K={k}: {lay.kernel}" for k, lay in sorted(c.DECODE_LAYOUTS.items()))
    print(f"spec {package.SPEC_PATH}: {c.RANKS} ranks (dp {c.DP}, ep {c.EP}) on {c.DEVICE}, "
          f"prefill tile {c.TILE} up to {c.MAX_EXTENT} rows x {c.SLOTS_PER_RANK} slots, "
          f"decode {layouts}")
    print("v4serve serve is a placeholder: the model kernels, runtime and HTTP server are "
          "not built yet, so nothing is served.", file=sys.stderr)
    return 0
