"""Tokenizer basics on the fixture's word-level vocabulary: ids, BOS/EOS, streamed text and
stop strings (multi-byte characters split across byte-level tokens:
tests/runtime/test_detokenizer.py)."""
from __future__ import annotations

import random

import pytest

from runtime.text.detokenizer import Detokenizer
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO
from tests.model.support import FIXTURE

TOK = Tokenizer(FIXTURE)


def test_reads_bos_and_eos_from_the_checkpoint():
    assert (TOK.bos_id, TOK.eos_id) == (0, 1)
    assert TOK.encode("t5 t6") == [5, 6] and TOK.decode([5, 6]) == "t5 t6"


def test_streamed_text_joins_to_the_full_text():
    detok = Detokenizer(TOK)
    pieces = [detok.add([i])[0] for i in (5, 6, 7, 8)]
    assert "".join(pieces) == "t5 t6 t7 t8" == detok.text


def test_a_stop_string_ends_the_text_before_it():
    detok = Detokenizer(TOK, stop=("t7",))
    released = []
    for token in (5, 6, 7, 8):
        delta, stop = detok.add([token])
        released.append(delta)
        if stop:
            break
    assert stop == "t7"
    assert "".join(released) == detok.text == "t5 t6 "


def test_held_back_text_is_released_when_the_output_ends():
    detok = Detokenizer(TOK, stop=("never seen",))
    delta, _ = detok.add([5, 6])
    assert delta + detok.flush() == "t5 t6"


# -- refusing an overlong prompt without encoding it whole ------------------------------

BYTE_LEVEL = Tokenizer(REPO / "models" / "tiny")     # byte-level BPE: a bound per token


def _spied(tokenizer: Tokenizer, monkeypatch) -> list[int]:
    """The lengths of the texts `tokenizer.encode` is given from now on."""
    seen, real = [], tokenizer.encode

    def encode(text, add_special_tokens=True):
        seen.append(len(text))
        return real(text, add_special_tokens)

    monkeypatch.setattr(tokenizer, "encode", encode)
    return seen


def test_a_byte_level_vocabulary_bounds_a_tokens_bytes():
    assert BYTE_LEVEL.max_token_bytes == 1 + max(
        len(BYTE_LEVEL.decode([i], False).encode()) for i in range(BYTE_LEVEL.vocab_size))
    assert TOK.max_token_bytes is None        # word-level: an unknown word is any length


def test_an_overlong_text_is_refused_by_its_size_without_encoding(monkeypatch):
    seen = _spied(BYTE_LEVEL, monkeypatch)
    huge = "def f(x):\n    return x + 1\n" * (1 << 18)          # 7 MiB
    assert BYTE_LEVEL.exceeds(huge, 16383) and seen == []


def test_without_a_bound_growing_prefixes_are_encoded_not_the_text(monkeypatch):
    seen = _spied(TOK, monkeypatch)
    huge = " ".join(f"t{i % 500}" for i in range(2_000_000))       # 11 MiB
    assert TOK.exceeds(huge, 16383)
    assert seen and max(seen) < len(huge) // 40


@pytest.mark.parametrize("tokenizer", [TOK, BYTE_LEVEL], ids=["word-level", "byte-level"])
def test_exceeds_never_refuses_a_text_that_fits(tokenizer):
    """exceeds(text, n) only when the text has more than n tokens, at every n near its
    count (texts long enough for the prefix walk to run)."""
    rng = random.Random(0)
    for trial in range(6):
        words = [rng.choice(["t5", "t17", "t300", "x", "héllo", "  ", "\n", "t1t2"])
                 for _ in range(3000 + 2000 * trial)]
        text = " ".join(words)
        count = len(tokenizer.encode(text, add_special_tokens=False))
        assert tokenizer.exceeds(text, count // 9)          # a prefix already shows it
        for limit in (count // 2, count - 17, count - 1, count, count + 50):
            if tokenizer.exceeds(text, limit):
                assert count > limit, (trial, limit, count)
