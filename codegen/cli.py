"""`v4serve codegen` (regenerate generated/ from specs/, or check that it is current) and
`v4serve spec new`. Defining the parsers imports nothing heavy (no pydantic, no jinja):
help is instant; a command imports what it runs."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

FIX = "make codegen"
WRITTEN = ("new", "changed", "removed")      # drift labels once codegen has written it

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


V41_SECTIONS = {
    "model": "the release's text_config keys (model_type: deepseek_v41_text); compress_ratios "
             "0 window only, r > 0 CSA2, a role from kv_source_layer_ids and "
             "index_source_layer_ids",
    "weights": "as V4's, plus engram: fp8 | unquantized (the Engram tables)",
    "pools": "block_size and the groups the kv sources need: ori; cmp_c<r> and idx_c<r> per "
             "kv-source ratio r; state_c<r> where r > 1 (layers list roles: window, full, "
             "reindex, reuse, dspark). Planned only: no kernels are generated yet",
}


def spec_fields_help() -> str:
    """A field reference built from the schema, so it cannot fall out of date."""
    from codegen.schema import Spec
    from codegen.schema_v41 import PoolGroupV41, SpecV41

    lines = ["spec sections (specs/*.yaml; every key is required, unknown keys are errors):"]
    for name, text in SECTIONS.items():
        fields = Spec.model_fields[name].annotation.model_fields
        lines += [f"  {name}: {text}", "      keys: " + ", ".join(fields)]
    lines.append("DeepSeek V4.1 specs differ in three sections:")
    for name, text in V41_SECTIONS.items():
        fields = SpecV41.model_fields[name].annotation.model_fields
        keys = PoolGroupV41.model_fields if name == "pools" else fields
        lines += [f"  {name} (V4.1): {text}",
                  f"      {'group keys' if name == 'pools' else 'keys'}: " + ", ".join(keys)]
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "codegen", help="generate kernel ABI tables, pools and contracts from specs",
        description="Generate generated/<spec>/ from specs/*.yaml: contract, pools, kernels.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)


def add_spec_parser(subparsers: argparse._SubParsersAction) -> None:
    spec = subparsers.add_parser("spec", help="write and inspect deployment specs")
    actions = spec.add_subparsers(dest="spec_command", required=True, metavar="ACTION")
    new = actions.add_parser(
        "new", help="write a spec for a checkpoint from its config.json and a base spec",
        description="Write a spec whose model section is the checkpoint's config.json and "
                    "whose serving shapes, pools, limits and topology come from --base.")
    new.add_argument("--from-config", required=True, type=Path,
                     help="the checkpoint's config.json")
    new.add_argument("--base", required=True, type=Path, help="spec to take serving choices from")
    new.add_argument("-o", "--output", required=True, type=Path, help="spec file to write")
    new.set_defaults(func=run_spec_new)


def run_spec_new(args: argparse.Namespace) -> int:
    from codegen.spec_new import run_new

    return run_new(args)


def configure(parser: argparse.ArgumentParser) -> None:
    _epilog_on_help(parser)
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


def _epilog_on_help(parser: argparse.ArgumentParser) -> None:
    """The spec field reference as the epilog, built only when help is shown (it imports
    the schema)."""
    plain = parser.format_help

    def format_help() -> str:
        parser.epilog = spec_fields_help()
        return plain()

    parser.format_help = format_help


def run(args: argparse.Namespace) -> int:
    from codegen.errors import SpecError
    from codegen.pipeline import generate

    paths = list(args.specs) or sorted(args.specs_dir.glob("*.yaml"))
    if not paths:
        print(f"codegen: no specs found in {args.specs_dir}", file=sys.stderr)
        return 2
    try:
        result = generate(paths, args.out, every=not args.specs, check=args.check)
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
        if drift.extra:         # e.g. a kernel of a retarget that `git checkout` left behind
            print("extra files come from no spec (an untracked leftover of an earlier "
                  f"codegen?); `{FIX}` removes them", file=sys.stderr)
        print(f"run `{FIX}` and commit the result", file=sys.stderr)
        return 1
    print(f"codegen: {len(result.plans)} spec(s) -> {args.out}/: {len(drift.missing)} new, "
          f"{len(drift.changed)} changed, {len(drift.extra)} removed, "
          f"{len(drift.unchanged)} unchanged")
    for line in drift.lines(WRITTEN):
        print(f"  {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="v4serve codegen", description="Generate generated/ from specs/*.yaml.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    args = parser.parse_args(argv)
    return args.func(args)
