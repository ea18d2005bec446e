"""`v4serve codegen`: regenerate generated/ from specs/, or check that it is current."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codegen.errors import SpecError
from codegen.pipeline import generate
from codegen.schema import Spec

FIX = "make codegen"

SECTIONS = {
    "model": "the architecture, keyed as the checkpoint's config.json (compress_ratios has "
             "one entry per layer plus one per MTP layer: 0 sliding, 4 CSA, 128 HCA)",
    "topology": "ranks of one replica: dp attention ranks x tp must equal ranks, ep = ranks; "
                "device cpu|cuda|npu; dtype; kernel backend",
    "prefill": "tile (rows per internal step), max_extent (rows of one main-prefill dispatch, "
               "a tile multiple), slots_per_rank (chunks per rank per launch), mtp_window",
    "decode": "num_speculative_tokens (the K values served) and one layout per K with "
              "seq = K + 1 (B8S1 for K=0, B4S2 for K=1, ...); micro_batches per step",
    "pools": "block_size and the seven groups (ori, cmp_c128, cmp_c4, idx, hca_state, "
             "csa_state, csa_inner_state): layers, rows_per_page, row_width, dtype, policy",
    "limits": "max_num_batched_tokens (per rank per step), long_prefill_token_threshold, "
              "max_model_len, max_num_seqs",
}


def spec_fields_help() -> str:
    """A field reference built from the schema, so it cannot fall out of date."""
    lines = ["spec sections (specs/*.yaml; every key is required, unknown keys are errors):"]
    for name, text in SECTIONS.items():
        fields = Spec.model_fields[name].annotation.model_fields
        lines += [f"  {name}: {text}", "      keys: " + ", ".join(fields)]
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "codegen", help="generate launch wrappers, pools and contracts from specs",
        description="Generate generated/<spec>/ from specs/*.yaml: contract, pools, kernels.",
        epilog=spec_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="*", type=Path,
                        help="spec files to generate alone (default: every specs/*.yaml, "
                             "and the generated/ index)")
    parser.add_argument("--specs-dir", type=Path, default=Path("specs"),
                        help="folder of specs (default: specs)")
    parser.add_argument("--out", type=Path, default=Path("generated"),
                        help="output folder (default: generated)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if the output differs from the specs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths = list(args.specs) or sorted(args.specs_dir.glob("*.yaml"))
    if not paths:
        print(f"codegen: no specs found in {args.specs_dir}", file=sys.stderr)
        return 2
    try:
        result = generate(paths, args.out, index=not args.specs, check=args.check)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    drift = result.drift
    if args.check:
        if drift.clean:
            print(f"codegen: {args.out}/ matches {len(result.plans)} spec(s)")
            return 0
        print(f"codegen: {args.out}/ is out of date with the specs:", file=sys.stderr)
        for line in drift.lines():
            print(f"  {line}", file=sys.stderr)
        print(f"run `{FIX}` and commit the result", file=sys.stderr)
        return 1
    print(f"codegen: {len(result.plans)} spec(s) -> {args.out}/: {len(drift.missing)} new, "
          f"{len(drift.changed)} changed, {len(drift.extra)} removed, "
          f"{len(drift.unchanged)} unchanged")
    for line in drift.lines():
        print(f"  {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="v4serve codegen", description="Generate generated/ from specs/*.yaml.",
        epilog=spec_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    args = parser.parse_args(argv)
    return args.func(args)
