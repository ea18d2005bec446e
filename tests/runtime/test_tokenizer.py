"""Tokenizer basics on the fixture's word-level vocabulary: ids, BOS/EOS, streamed text and
stop strings (multi-byte characters split across byte-level tokens:
tests/runtime/test_detokenizer.py)."""
from __future__ import annotations

from runtime.detokenizer import Detokenizer
from runtime.tokenizer import Tokenizer
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
