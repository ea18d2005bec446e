"""Incremental detokenization on the embedded model's byte-level BPE tokenizer: the text
streamed piece by piece equals the whole output decoded at once (multi-byte characters
split across tokens included), and each step decodes a bounded window."""
from __future__ import annotations

import random
import statistics

import pytest

from runtime.text.detokenizer import Detokenizer
from runtime.text.growing_text import CHUNK
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO
from tests.runtime.allocation import peak_bytes, tracing

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


# -- long outputs: the work per step does not grow with the text --------------------------

LONG = TOK.encode(TEXT * 400 + " STOP " + TEXT, add_special_tokens=False)


def test_a_long_output_streams_whole_and_a_stop_string_far_in_still_cuts_it():
    assert len(LONG) > 20_000
    streamed, text, hit = _streamed(LONG, random.Random(2), stop=("never seen", "STOP"))
    assert hit == "STOP" and streamed == text == TEXT * 400 + " "


def test_the_memory_an_add_allocates_does_not_grow_with_the_text():
    """One token at a time through 20,000 tokens of multi-byte text: the last adds
    allocate about what the early ones do (a copy of the text so far, at 4 bytes a
    character for an emoji's sake, would be hundreds of kB by then). Medians over 200
    adds, as a list's growth now and then reallocates it."""
    detok = Detokenizer(TOK, stop=("never seen", "STOP"))
    peaks: dict[int, int] = {}
    with tracing():
        for at, token in enumerate(LONG[:20_000]):
            if 1000 <= at < 1200 or at >= 19_800:
                peaks[at] = peak_bytes(lambda token=token: detok.add([token]))
            else:
                detok.add([token])
    start = statistics.median(v for k, v in peaks.items() if k < 1200)
    end = statistics.median(v for k, v in peaks.items() if k >= 19_800)
    # the tail of the released text (under CHUNK characters, 4 bytes each at most) is
    # all an add copies of it: where it stands differs between the two samples
    assert end <= 2 * start + 4 * CHUNK and end < 16_000, (start, end)
