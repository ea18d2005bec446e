"""The flags every benchmark shares: the spec, its checkpoint, the tokens generated."""
from __future__ import annotations

import argparse
from pathlib import Path

from server.cli.spec_check import default_model


def bench_parser(doc: str, max_tokens: int = 64,
                 prompt_len: int | None = 256) -> argparse.ArgumentParser:
    """A parser described by the first line of `doc`, with --spec, --model, --max-tokens
    and (unless `prompt_len` is None) --prompt-len."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--spec", default="tiny")
    parser.add_argument("--model", type=Path, default=default_model("tiny"))
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    if prompt_len is not None:
        parser.add_argument("--prompt-len", type=int, default=prompt_len)
    return parser
