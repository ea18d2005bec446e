"""One request's failure is its own: a request whose sampling row cannot be built, whose
distribution comes out unsound (no finite mass), or whose detokenization raises ends
with an error and frees what it held, while the others run on unchanged. A failure of
the shared step still stops the engine (tests/runtime/test_async_engine.py)."""
from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.core.sampling_params import SamplingParams
from runtime.device.grammar_masks import GrammarMasks
from runtime.engine.async_engine import AsyncEngine
from runtime.engine.client import RequestFailedError
from runtime.sampling import batch_sampler
from tests.model.support import reference_params
from tests.runtime.engine_support import (
    FAULT,
    assert_all_free,
    break_detokenizer,
    make_engine,
    random_prompt,
)

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MARK = 424242                      # the seed that marks the faulty request's rows
FAULTY_PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, seed=MARK)
PROMPTS = [random_prompt(40 + 17 * i, 100 + i) for i in range(9)]
FAULTY = 4


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture(scope="module")
def clean(params):
    """Greedy outputs of the eight healthy prompts, run without any fault."""
    healthy = [p for i, p in enumerate(PROMPTS) if i != FAULTY]
    return [o.output_ids for o in make_engine(params).generate(healthy, PARAMS)]


def unsound_rows(monkeypatch, after: int) -> None:
    """The faulty request's logits turn NaN once it has `after` output tokens."""
    real = batch_sampler.adjusted

    def patched(logits, rows, *args):
        out = real(logits, rows, *args)
        bad = (rows.seed == MARK) & (rows.counter >= after)
        return torch.where(bad[:, None], float("nan"), out)

    monkeypatch.setattr(batch_sampler, "adjusted", patched)


def failing_rows(monkeypatch, after: int) -> None:
    """The host's share of the faulty request's sampling row (its grammar mask, built
    for every row) raises once it has `after` tokens."""
    real = GrammarMasks.check

    def patched(self, request):
        if request.params.seed == MARK and len(request.output_ids) >= after:
            raise RuntimeError("injected sampling fault")
        return real(self, request)

    monkeypatch.setattr(GrammarMasks, "check", patched)


def _run(engine):
    """Every prompt, the faulty one with FAULTY_PARAMS: (its final output, the others')."""
    ids = [engine.add_request(p, FAULTY_PARAMS if i == FAULTY else PARAMS).request_id
           for i, p in enumerate(PROMPTS)]
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    return final[ids[FAULTY]], [final[i].output_ids for j, i in enumerate(ids) if j != FAULTY]


@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.parametrize("after", [0, 3], ids=["first-token", "mid-decode"])
@pytest.mark.parametrize(("inject", "message"), [
    (unsound_rows, "no token has a finite, positive probability"),
    (failing_rows, "injected sampling fault")], ids=["unsound", "raising"])
def test_a_sampling_fault_ends_only_its_request(params, clean, monkeypatch, k, after, inject,
                                                message):
    inject(monkeypatch, after)
    engine = make_engine(params, num_speculative_tokens=k)
    failed, others = _run(engine)
    assert failed.finished and failed.finish_reason == "error"
    assert message in failed.error
    assert len(failed.output_ids) <= after + k
    assert others == clean
    assert_all_free(engine)


def test_a_detokenizer_fault_ends_only_its_request(params, clean, monkeypatch):
    break_detokenizer(monkeypatch)
    engine = make_engine(params)
    faulty = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop=(FAULT,))
    ids = [engine.add_request(p, faulty if i == FAULTY else PARAMS).request_id
           for i, p in enumerate(PROMPTS)]
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert final[ids[FAULTY]].finish_reason == "error"
    assert "injected detokenizer fault" in final[ids[FAULTY]].error
    assert [final[i].output_ids for j, i in enumerate(ids) if j != FAULTY] == clean
    assert_all_free(engine)


def test_the_async_engine_fails_one_stream_and_serves_the_rest(params, clean, monkeypatch):
    unsound_rows(monkeypatch, 2)
    engine = AsyncEngine(make_engine(params))
    engine.start()

    async def collect(i):
        params = FAULTY_PARAMS if i == FAULTY else PARAMS
        return [out async for out in engine.generate(PROMPTS[i], params, f"r{i}")]

    async def main():
        return await asyncio.gather(*(collect(i) for i in range(len(PROMPTS))),
                                    return_exceptions=True)

    try:
        results = asyncio.run(main())
        failed = results.pop(FAULTY)
        assert isinstance(failed, RequestFailedError) and "finite" in str(failed)
        assert [sum((o.new_ids for o in stream), []) for stream in results] == clean
        assert engine.healthy
        engine.run_locked(assert_all_free)
    finally:
        engine.shutdown()
