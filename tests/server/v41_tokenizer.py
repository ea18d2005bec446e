"""A small tokenizer with DeepSeek V4.1's control tokens, built in-process (no download):
tests/server/v4_tokenizer.py's BPE with "<｜System｜>" and the image placeholder added as
special tokens, beside V4's BOS, EOS, User, Assistant, think tags and "｜DSML｜"."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken

from server.v4_encoding import BOS, EOS
from server.v41_encoding import SYSTEM
from tests.server.v4_tokenizer import build_tokenizer

IMAGE = "<｜deepseek_image｜>"


def write_v41_tokenizer(directory: Path) -> Path:
    """tokenizer.json and tokenizer_config.json (bos_token, eos_token) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in (SYSTEM, IMAGE)])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return directory
