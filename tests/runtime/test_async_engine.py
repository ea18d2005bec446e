"""AsyncEngine: streaming, cancellation frees the request, a dead engine fails fast."""
from __future__ import annotations

import asyncio

import pytest

from runtime.core.sampling_params import SamplingParams
from runtime.engine.async_engine import AsyncEngine
from runtime.engine.client import EngineDeadError
from tests.model.support import reference_params
from tests.runtime.engine_support import assert_all_free, make_engine, random_prompt

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture
def engine(params):
    engine = AsyncEngine(make_engine(params))
    engine.start()
    yield engine
    engine.shutdown()


async def _collect(engine, prompt, request_id):
    return [out async for out in engine.generate(prompt, PARAMS, request_id)]


def test_streams_match_offline_generation(engine, params):
    prompts = [random_prompt(50 + i, i) for i in range(6)]

    async def main():
        return await asyncio.gather(*(_collect(engine, p, f"r{i}") for i, p in enumerate(prompts)))

    streams = asyncio.run(main())
    offline = make_engine(params).generate(prompts, PARAMS)
    for stream, want in zip(streams, offline):
        assert sum((o.new_ids for o in stream), []) == want.output_ids
        assert [o.finished for o in stream].count(True) == 1 and stream[-1].finished
    engine.run_locked(assert_all_free)


def test_a_cancelled_consumer_aborts_its_request(engine):
    async def main():
        stream = engine.generate(random_prompt(300, 1), SamplingParams(
            temperature=0, max_tokens=500, ignore_eos=True), "long")
        first = await stream.__anext__()
        await stream.aclose()
        return first

    assert not asyncio.run(main()).finished
    engine.run_locked(assert_all_free)
    assert engine.num_in_flight == 0


def test_a_failing_step_turns_the_engine_unhealthy(engine):
    def boom():
        raise RuntimeError("device lost")

    engine.engine.step = boom

    async def main():
        return await _collect(engine, [5, 6, 7], "doomed")

    with pytest.raises(EngineDeadError, match="device lost"):
        asyncio.run(main())
    assert not engine.healthy
    with pytest.raises(EngineDeadError):
        asyncio.run(main())
