"""A small tokenizer with DeepSeek V4's control tokens, built in-process (no download).

A byte-level BPE trained on a few KB of chat-shaped text (vocabulary about 500). As in the
released V4 tokenizer, BOS, EOS, User and Assistant are special tokens, while "<think>",
"</think>" and "｜DSML｜" are added but not special, so decoding with
skip_special_tokens=True keeps them.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from server.v4_encoding import ASSISTANT, BOS, DSML, END_THINK, EOS, THINK, USER

SPECIAL = (BOS, EOS, USER, ASSISTANT)
ADDED = (THINK, END_THINK, DSML)
VOCAB_SIZE = 500

_LINES = (
    "The user asks what the weather is like in Paris today, so I should call the tool.",
    'get_weather {"city": "Paris", "unit": "celsius"} returned 21 degrees and sunny.',
    "You are a helpful assistant. Answer briefly and cite the numbers you used.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5",
    "Reasoning: 17 * 23 = 391, then subtract 91 to get 300; check: 300 + 91 = 391.",
    '<tool_result>{"temperature": 21, "sky": "clear"}</tool_result>',
    'invoke name="search" parameter name="query" string="true" string="false"',
    "Bonjour, ça va ? Très bien, merci. 你好，世界。 Grüße aus München!",
)
CORPUS = "\n".join(_LINES * 8)


def build_tokenizer(*, v4_tokens: bool = True) -> Tokenizer:
    """The trained BPE; with the V4 control tokens unless `v4_tokens` is False."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL) if v4_tokens else [])
    tokenizer.train_from_iterator([CORPUS], trainer)
    if v4_tokens:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return tokenizer


def write_v4_tokenizer(directory: Path) -> Path:
    """tokenizer.json and tokenizer_config.json (bos_token, eos_token) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return directory
