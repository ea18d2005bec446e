"""The OutputProcessor (Deltas of token ids -> RequestOutputs, the one home of text and
stop strings for the in-process engine and the core client); the intake's tests are
tests/runtime/test_intake.py."""
from __future__ import annotations

import statistics

from runtime.engine.output_processor import Delta, OutputProcessor
from runtime.text.growing_text import CHUNK
from runtime.text.tokenizer import Tokenizer
from tests.conftest import REPO
from tests.runtime.allocation import peak_bytes, tracing
from tests.runtime.engine_support import FAULT, break_detokenizer

TOK = Tokenizer(REPO / "models" / "tiny")
IDS = TOK.encode("def fibonacci(n): return n", add_special_tokens=False)
TEXT = TOK.decode(IDS)


def _run(processor: OutputProcessor, request_id: str, ids: list[int], step: int = 2):
    """Deltas of `step` ids each (the last one finished by the scheduler, "length"):
    every output until the processor ends the request."""
    outs = []
    for at in range(0, len(ids), step):
        end = at + step >= len(ids)
        delta = Delta(request_id, ids[at:at + step], end, "length" if end else None)
        outs += processor.process([delta])
        if outs[-1].finished:
            return outs
    return outs


def test_text_streams_whole_and_the_scheduler_finish_flushes_what_was_held():
    processor = OutputProcessor(TOK)
    processor.add("a", [1, 2], stop=("never seen",))
    outs = _run(processor, "a", IDS)
    assert "".join(o.new_text for o in outs) == outs[-1].text == TEXT
    assert outs[-1].output_ids == IDS and outs[-1].prompt_ids == [1, 2]
    assert outs[-1].finish_reason == "length" and outs[-1].stop_reason is None
    assert processor.process([Delta("a", [5], False)]) == []     # forgotten once finished


def test_a_stop_string_ends_the_output_before_it():
    processor = OutputProcessor(TOK)
    processor.add("a", [], stop=("(n)",))
    outs = _run(processor, "a", IDS, step=1)
    last = outs[-1]
    assert last.finished and last.finish_reason == "stop" and last.stop_reason == "(n)"
    assert last.text == TEXT[:TEXT.index("(n)")] == "".join(o.new_text for o in outs)
    assert len(last.output_ids) < len(IDS)


def test_the_schedulers_finish_in_the_same_step_keeps_its_reason_and_releases_all():
    processor = OutputProcessor(TOK)
    processor.add("a", [], stop=("(n)",))
    [out] = processor.process([Delta("a", IDS, True, "stop", 7)])
    assert (out.finish_reason, out.stop_reason) == ("stop", 7)
    assert out.text == TEXT                     # all released, the stop string too


def test_without_a_tokenizer_outputs_carry_ids_only():
    processor = OutputProcessor(None)
    processor.add("a", [1], stop=("(n)",))
    [out] = processor.process([Delta("a", IDS, False, num_cached_tokens=0)])
    assert (out.text, out.new_text, out.new_ids, out.finished) == ("", "", IDS, False)
    assert out.num_cached_tokens == 0


def test_an_engine_error_and_a_text_fault_end_only_their_request(monkeypatch):
    break_detokenizer(monkeypatch)
    processor = OutputProcessor(TOK)
    for request_id, stop in [("ok", ()), ("bad", (FAULT,)), ("core", ())]:
        processor.add(request_id, [1], stop)
    ok, bad, core = processor.process([
        Delta("ok", IDS[:2], False), Delta("bad", IDS[:2], False),
        Delta("core", [], True, "error", error="boom")])
    assert not ok.finished and ok.text
    assert (bad.finished, bad.finish_reason) == (True, "error")
    assert bad.error == "UnicodeError: injected detokenizer fault"
    assert bad.output_ids == IDS[:2] and (bad.text, bad.new_ids) == ("", [])
    assert (core.finish_reason, core.error) == ("error", "boom")
    failed, = processor.process([Delta("ok", [], True, "error", error="RuntimeError: sampling",
                                       num_cached_tokens=3)])
    assert failed.error == "RuntimeError: sampling" and failed.output_ids == IDS[:2]
    assert failed.num_cached_tokens == 3
    assert processor.process([Delta(r, [5], False) for r in ("ok", "bad", "core")]) == []


# -- the work per step does not grow with the output --------------------------------------

LONG = TOK.encode("def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + n\n" * 1400,
                  add_special_tokens=False)


def test_outputs_are_snapshots_that_later_steps_leave_as_they_were():
    processor = OutputProcessor(TOK)
    processor.add("a", [1, 2], stop=("never seen",))
    outs = _run(processor, "a", LONG[:3000], step=1)
    for n in (0, 1, 50, 1500):      # each output still reads as of its own step
        assert outs[n].output_ids == LONG[:n + 1] == list(outs[n].output_ids)
        assert outs[n].text == "".join(o.new_text for o in outs[:n + 1])
    last = outs[-1]
    assert last.text == TOK.decode(LONG[:3000]) and last.output_ids == tuple(LONG[:3000])
    assert last.output_ids[-2:] == LONG[2998:3000] and last.output_ids[-1] == LONG[2999]
    assert [9] + outs[1].output_ids == [9, *LONG[:2]] == [9] + list(outs[1].output_ids)
    assert last.prompt_ids is outs[0].prompt_ids       # the prompt is never copied


def test_the_memory_a_step_allocates_does_not_grow_with_the_output():
    """20,000 steps of one token: the last steps allocate about what the early ones do
    (a step that copied the ids so far would allocate 8 bytes an id: 160 kB at the end).
    Medians over 200 steps, as a list's growth now and then reallocates it (amortized
    O(1) an append)."""
    processor = OutputProcessor(TOK)
    processor.add("a", [1, 2], stop=("never seen", ")n("))
    assert len(LONG) > 20_000
    peaks: dict[int, int] = {}
    with tracing():
        for at, token in enumerate(LONG[:20_000]):
            def step(token=token):
                return processor.process([Delta("a", [token], False)])
            if 1000 <= at < 1200 or at >= 19_800:
                peaks[at] = peak_bytes(step)
            else:
                step()
    start = statistics.median(v for k, v in peaks.items() if k < 1200)
    end = statistics.median(v for k, v in peaks.items() if k >= 19_800)
    # the tail of the released text (under CHUNK characters, 4 bytes each at most) is
    # all an add copies of it: where it stands differs between the two samples
    assert end <= 2 * start + 4 * CHUNK and end < 8_000, (start, end)
