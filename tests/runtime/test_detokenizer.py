"""Incremental detokenization on the embedded model's byte-level BPE tokenizer: the text
streamed piece by piece equals the whole output decoded at once (multi-byte characters
split across tokens, bytes that are never valid UTF-8, unfinished characters, at every
split), released text lags the ids by one unfinished character at most, and the work a
step does stays bounded whatever the bytes: on the byte path and on the window path
(what a vocabulary without token bytes uses, forced here on the same vocabulary)."""
from __future__ import annotations

import itertools
import random
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.text.detokenizer import CONTEXT, HELD, Detokenizer
from runtime.text.growing_text import CHUNK
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO
from tests.runtime.allocation import peak_bytes, tracing

TOK = Tokenizer(REPO / "models" / "tiny")
TEXT = "héllo wörld — ünïcödé ✓ 日本語テキスト 🎉🎉 def f(x):\n    return x  # ok"


def _whole(ids: list[int]) -> str:
    return TOK.decode(ids)


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


def _counting(tokenizer: Tokenizer, monkeypatch) -> list[int]:
    """The number of ids each `tokenizer.decode` call is given from now on."""
    widths, real = [], tokenizer.decode

    def counting(window, **kw):
        widths.append(len(window))
        return real(window, **kw)

    monkeypatch.setattr(tokenizer, "decode", counting)
    return widths


def _windowed() -> Tokenizer:
    """The same vocabulary with no token bytes: its Detokenizer decodes in windows."""
    tokenizer = Tokenizer(REPO / "models" / "tiny")
    tokenizer.__dict__["token_bytes"] = None      # the cached_property's slot
    return tokenizer


def test_each_step_decodes_a_bounded_window(monkeypatch):
    tokenizer = _windowed()
    ids = tokenizer.encode(TEXT * 40, add_special_tokens=False)
    widths = _counting(tokenizer, monkeypatch)
    detok = Detokenizer(tokenizer)
    for token in ids:
        detok.add([token])
    assert detok.text == TEXT * 40
    assert max(widths) <= 12 < len(ids)


def test_a_byte_level_vocabulary_is_decoded_without_decoding_windows(monkeypatch):
    ids = TOK.encode(TEXT * 40, add_special_tokens=False)
    widths = _counting(TOK, monkeypatch)
    detok = Detokenizer(TOK)
    for token in ids:
        detok.add([token])
    assert detok.text == TEXT * 40 and widths == []


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


# -- bytes that are not (yet) valid UTF-8: at every split, the whole decode ----------------

BYTE = {raw[0]: i for i, raw in enumerate(TOK.token_bytes) if len(raw) == 1}
EDGES = (0x41, 0x80, 0x8F, 0x9F, 0xA9, 0xBF, 0xC0, 0xC3, 0xDF, 0xE0, 0xE2, 0xED, 0xF0,
         0xF4, 0xF5, 0xFF)     # ASCII, continuations, leads, never-valid bytes
SPECIALS = (TOK.bos_id, TOK.eos_id)      # skipped by decode, so they carry no bytes


def _bytes(raw: bytes) -> list[int]:
    return [BYTE[b] for b in raw]


def _splits(ids: list[int]):
    """Every way to cut `ids` into consecutive non-empty steps."""
    for cuts in itertools.product((False, True), repeat=max(len(ids) - 1, 0)):
        chunks, start = [], 0
        for at, cut in enumerate(cuts, 1):
            if cut:
                chunks.append(ids[start:at])
                start = at
        yield chunks + [ids[start:]]


def _check(tokenizer: Tokenizer, chunks: list[list[int]], stop: str | None = None) -> None:
    """Streams `chunks`: the text equals the whole decode (cut before the first `stop`),
    and without a stop the text released after each step is a prefix of the whole text
    at most one character (an unfinished one) behind the decode of the ids so far."""
    ids = [i for chunk in chunks for i in chunk]
    whole = tokenizer.decode(ids)
    cut = whole.find(stop) if stop else -1
    detok, pieces, seen, hit = Detokenizer(tokenizer, (stop,) if stop else ()), [], [], None
    for chunk in chunks:
        seen += chunk
        delta, hit = detok.add(chunk)
        pieces.append(delta)
        if hit:
            break
        if not stop:
            assert whole.startswith(detok.text), (ids, chunks)
            assert len(tokenizer.decode(seen)) - len(detok.text) <= 1, (ids, chunks)
    if not hit:
        pieces.append(detok.flush())
    expected = whole[:cut] if cut >= 0 else whole
    assert "".join(pieces) == detok.text == expected, (ids, chunks)
    assert hit == (stop if cut >= 0 else None)


def test_0xff_is_a_token_of_the_vocabulary_that_decodes_to_u_fffd():
    assert TOK.token_bytes[189] == b"\xff" and TOK.decode([189]) == "\ufffd"
    assert len(BYTE) == 256


@pytest.mark.parametrize("length", [1, 2, 3])
def test_every_split_of_every_short_byte_sequence_equals_its_whole_decode(length):
    for raw in itertools.product(EDGES, repeat=length):
        for chunks in _splits(_bytes(bytes(raw))):
            _check(TOK, chunks)


def test_every_split_of_four_bytes_with_specials_and_text_between():
    alphabet = (0x41, 0x80, 0x9F, 0xE2, 0xF0, 0xFF)
    for raw in itertools.product(alphabet, repeat=4):
        ids = _bytes(bytes(raw))
        for chunks in _splits(ids):
            _check(TOK, chunks)
        # a skipped special token and text between them
        for at in range(1, 4):
            _check(TOK, [ids[:at], [TOK.eos_id], ids[at:]])
            _check(TOK, [ids[:at] + TOK.encode("é x", add_special_tokens=False), ids[at:]])


CASES = {
    "0xff": b"ab\xffcd",
    "lone continuations": b"\x80\xbfa\x9f",
    "truncated 2-byte": b"x\xc3",
    "truncated 3-byte": b"x\xe2\x82",
    "truncated 4-byte": b"x\xf0\x9f\x8e",
    "truncated then text": b"\xe2\x82x\xf0\x9fy\xc3z",
    "split valid": "é€🎉日".encode(),
    "surrogate and overlong": b"\xed\xa0\x80\xc0\xaf\xe0\x80\xaf\xf4\x90\x80\x80",
    "mixed": b"\xff" + "é".encode() + b"\xe2\x82" + "€".encode() + b"\xf0\x9f\x8e\x89\x80",
}


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_invalid_and_unfinished_characters_at_every_split(raw):
    for chunks in _splits(_bytes(raw)):
        _check(TOK, chunks)


@pytest.mark.parametrize("stop", ["\ufffd", "€c", "\ufffd€", "c\ufffd\ufffd", "\ufffd\ufffdd"])
def test_stop_strings_with_invalid_bytes_at_every_split(stop):
    raw = b"\xe2\x82" + "€c".encode() + b"\xff\xf0\x80d"     # "\ufffd€c\ufffd\ufffd\ufffdd"
    for chunks in _splits(_bytes(raw)):
        _check(TOK, chunks, stop)


def test_an_unfinished_character_waits_for_its_bytes_and_a_never_valid_one_does_not():
    detok = Detokenizer(TOK)
    assert [detok.add([BYTE[b]])[0] for b in b"\xe2\x82\xac\xff\xf0\x9f"] == \
        ["", "", "€", "\ufffd", "", ""]
    assert detok.add([BYTE[0x41]])[0] == "\ufffdA"       # F0 9F ended by a non-continuation
    assert detok.add([BYTE[0xC3]])[0] == "" and detok.flush() == "\ufffd"


def _token_ids():
    byte = st.sampled_from(sorted(BYTE.values()))
    vocab = st.integers(0, TOK.vocab_size - 1)
    rare = st.sampled_from([*SPECIALS, TOK.vocab_size, TOK.vocab_size + 7])
    return st.lists(st.one_of(byte, byte, vocab, rare), max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ids=_token_ids(), data=st.data())
def test_any_ids_at_any_split_equal_their_whole_decode(ids, data):
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=len(ids), max_size=len(ids)))
    chunks, at = [], 0
    for size in sizes:
        if at < len(ids):
            chunks.append(ids[at:at + size])
            at += size
    stop = None
    if data.draw(st.booleans()):
        # a stop string is looked for in what `add` decodes, and an unfinished
        # character at the end is decoded by flush() alone: end on a whole one
        chunks.append([BYTE[ord(".")]])
        whole = TOK.decode([i for chunk in chunks for i in chunk])
        start = data.draw(st.integers(0, len(whole) - 1))
        stop = whole[start:start + data.draw(st.integers(1, 3))]
    _check(TOK, chunks or [[]], stop)


# -- never-valid bytes do not make the work grow with the output -------------------------

WORDS = [TOK.encode(f" w{n}", add_special_tokens=False)[0] for n in range(10)]
HOSTILE = [i for n in range(10) for i in (*[189] * 499, WORDS[n])]   # runs of 0xFF, a word


def test_never_valid_bytes_stream_as_u_fffd_in_bounded_windows(monkeypatch):
    """5,000 tokens, runs of 499 0xFF between words: each 0xFF comes out as U+FFFD when
    it is added, and the ids decoded in all stay linear in the tokens: none on the byte
    path, windows of at most CONTEXT + HELD + 1 on the window path (whose window, ending
    in U+FFFD, used to grow through each run: 1.25M ids decoded here)."""
    assert len(HOSTILE) == 5000
    whole = TOK.decode(HOSTILE)
    for tokenizer in (TOK, _windowed()):
        widths = _counting(tokenizer, monkeypatch)
        detok, pieces = Detokenizer(tokenizer, stop=("never seen",)), []
        for token in HOSTILE:
            pieces.append(detok.add([token])[0])
        pieces.append(detok.flush())
        assert "".join(pieces) == detok.text == whole
        assert detok.text.count("\ufffd") == 4990
        assert sum(widths) <= 2 * (CONTEXT + HELD + 1) * len(HOSTILE), sum(widths)
        assert max(widths, default=0) <= CONTEXT + HELD + 1


@pytest.mark.parametrize("raw", [b"\xff", b"\xe2\x82", b"\x80"])
def test_a_run_of_invalid_bytes_keeps_the_window_bounded(raw, monkeypatch):
    """Nothing but invalid or unfinished bytes, one token a step, on the window path: the
    window is committed after HELD tokens, and the text is the whole decode."""
    tokenizer = _windowed()
    ids = _bytes(raw * 3000)[:3000]
    whole = TOK.decode(ids)
    widths = _counting(tokenizer, monkeypatch)
    detok = Detokenizer(tokenizer)
    text = "".join(detok.add([token])[0] for token in ids) + detok.flush()
    assert max(widths) <= CONTEXT + HELD + 1
    assert text == whole


def test_the_memory_an_add_allocates_on_never_valid_bytes_stays_flat():
    """The byte path through 20,000 tokens, runs of 0xFF between words: the last adds
    allocate about what the early ones do."""
    ids = (HOSTILE * 4)[:20_000]
    detok = Detokenizer(TOK, stop=("never seen",))
    peaks: dict[int, int] = {}
    with tracing():
        for at, token in enumerate(ids):
            if 1000 <= at < 1200 or at >= 19_800:
                peaks[at] = peak_bytes(lambda token=token: detok.add([token]))
            else:
                detok.add([token])
    start = statistics.median(v for k, v in peaks.items() if k < 1200)
    end = statistics.median(v for k, v in peaks.items() if k >= 19_800)
    assert end <= 2 * start + 4 * CHUNK and end < 16_000, (start, end)


def test_a_v4_shaped_vocabulary_streams_its_added_and_special_tokens_as_decode_does(
        tmp_path):
    """Added tokens ("</think>", "｜DSML｜": UTF-8 outside the byte alphabet) are their
    text, special ones (BOS) nothing, between bytes that are not valid on their own."""
    from tests.server.v4_tokenizer import write_v4_tokenizer

    tokenizer = Tokenizer(write_v4_tokenizer(tmp_path))
    assert tokenizer.token_bytes is not None
    marks = [tokenizer.token_id(t) for t in ("<think>", "</think>", "｜DSML｜")]
    marks.append(tokenizer.bos_id)
    singles = [i for i, raw in enumerate(tokenizer.token_bytes) if len(raw) == 1]
    rng = random.Random(5)
    for _ in range(300):
        ids = [rng.choice([*marks, *rng.sample(singles, 3), rng.randrange(tokenizer.vocab_size)])
               for _ in range(rng.randint(1, 12))]
        cuts = sorted(rng.sample(range(1, len(ids)), rng.randint(0, len(ids) - 1)))
        _check(tokenizer, [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])])
