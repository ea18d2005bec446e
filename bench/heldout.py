"""Held-out figures of the embedded model, over the whole held-out set, near-duplicates of
training files set apart. Prints figures; asserts nothing.

    .venv/bin/python bench/heldout.py [--model models/tiny] [--overlap 0.5]

The held-out files are bench/train_tiny.py's (every 25th standard-library file). Some
nearly repeat a file the model trained on (encodings/cp858.py and cp850.py differ in 6 of
698 lines): a held-out file is a near-duplicate when at least `--overlap` of its distinct
non-blank lines (stripped) occur in one training file. Perplexity and MTP loss are taken
over every disjoint 512-token window of each set's token stream (the last partial window
dropped), with the checkpoint as saved (bf16 matrices).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.train_tiny import SPEC, corpus_files, evaluate, split, token_stream  # noqa: E402
from runtime.weights.loader import load_params  # noqa: E402
from server.cli.spec_check import default_model  # noqa: E402

WINDOW = 512


def lines_of(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return {line.strip() for line in text.splitlines() if line.strip()}


def nearest_twin(held: Path, train: dict[Path, set[str]]) -> tuple[Path, float]:
    """The training file sharing the largest fraction of `held`'s lines, and the fraction."""
    mine = lines_of(held)
    best = max(train, key=lambda t: len(mine & train[t]))
    return best, len(mine & train[best]) / max(1, len(mine))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model("tiny"))
    parser.add_argument("--overlap", type=float, default=0.5)
    args = parser.parse_args()
    train_files, held_files = split(corpus_files())
    train = {f: lines_of(f) for f in train_files}
    twins = {f: nearest_twin(f, train) for f in held_files}
    clean = [f for f in held_files if twins[f][1] < args.overlap]
    near = [f for f in held_files if twins[f][1] >= args.overlap]
    root = corpus_files()[0].parents[0]
    print(f"# {len(held_files)} held-out files; near-duplicates (>= {args.overlap:.0%} of "
          f"their lines in one training file): {len(near)}")
    for f in near:
        twin, share = twins[f]
        print(f"#   {_rel(f, root)} ~ {_rel(twin, root)} ({share:.0%})")
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    params = load_params(args.model, SPEC, device="cpu")
    print(f"{'set':<16} {'files':>5} {'tokens':>8} {'windows':>7} {'perplexity':>10} "
          f"{'MTP loss':>8}")
    for name, files in (("clean", clean), ("near-duplicate", near), ("all", held_files)):
        stream = token_stream(_Encoder(tok), files)
        windows = (len(stream) - 1) // WINDOW
        with torch.inference_mode():
            ppl, mtp = evaluate(params, stream, WINDOW, windows, SPEC.contract.TILE)
        print(f"{name:<16} {len(files):>5} {len(stream):>8} {windows:>7} {ppl:>10.2f} "
              f"{mtp:>8.3f}", flush=True)


class _Encoder:
    """tokenizers.Tokenizer as train_tiny's token_stream reads it (`encode(text).ids`)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok

    def encode(self, text: str):
        return self.tok.encode(text, add_special_tokens=False)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main()
