"""Incremental detokenization on the embedded model's byte-level BPE tokenizer: the text
streamed piece by piece equals the whole output decoded at once (multi-byte characters
split across tokens included), and each step decodes a bounded window."""
from __future__ import annotations

import random

import pytest

from runtime.text.detokenizer import Detokenizer
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO

TOK = Tokenizer(REPO / "models" / "tiny")
TEXT = "héllo wörld — ünïcödé ✓ 日本語テキスト 🎉🎉 def f(x):\n    return x  # ok"


def _whole(ids: list[int]) -> str:
    return TOK.decode(ids).rstrip("\ufffd")


def _streamed(ids: list[int], rng: random.Random, stop=()) -> tuple[str, str, str | None]:
    detok, pieces, at = Detokenizer(TOK, stop), [], 0
    while at < len(ids):
        step = rng.randint(1, 3)
        delta, hit = detok.add(ids[at:at + step])
        pieces.append(delta)
        at += step
        if hit:
            return "".join(pieces), detok.text, hit
    pieces.append(detok.flush())
    return "".join(pieces), detok.text, None


def test_multibyte_characters_split_across_tokens_come_out_whole():
    ids = TOK.encode(TEXT, add_special_tokens=False)
    assert any("\ufffd" in TOK.decode([i]) for i in ids)    # some token ends mid-character
    streamed, text, _ = _streamed(ids, random.Random(0))
    assert streamed == text == TEXT


@pytest.mark.parametrize("seed", range(40))
def test_random_token_streams_equal_their_whole_decode(seed):
    rng = random.Random(seed)
    ids = [rng.randrange(TOK.vocab_size) for _ in range(rng.randint(1, 80))]
    streamed, text, _ = _streamed(ids, rng)
    assert streamed == text == _whole(ids)


def test_a_stop_string_made_of_multibyte_characters_cuts_the_text_before_it():
    ids = TOK.encode(TEXT, add_special_tokens=False)
    streamed, text, hit = _streamed(ids, random.Random(1), stop=("日本",))
    assert hit == "日本" and streamed == text == TEXT[:TEXT.index("日本")]


def test_each_step_decodes_a_bounded_window(monkeypatch):
    ids = TOK.encode(TEXT * 40, add_special_tokens=False)
    widths = []
    real = TOK.decode

    def counting(window, **kw):
        widths.append(len(window))
        return real(window, **kw)

    monkeypatch.setattr(TOK, "decode", counting)
    detok = Detokenizer(TOK)
    for token in ids:
        detok.add([token])
    assert detok.text == TEXT * 40
    assert max(widths) <= 12 < len(ids)
