"""A request's token history read without building it: the tail in O(1), a span in
O(its length), equal to slicing prompt + output."""
from __future__ import annotations

import pytest

from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams


@pytest.mark.parametrize("prompt, output", [([1], []), ([1, 2, 3], []), ([1, 2, 3], [4]),
                                            ([1, 2], [3, 4, 5]), ([7], [8, 9])])
def test_spans_and_the_tail_read_what_the_whole_history_holds(prompt, output):
    request = Request("r", list(prompt), SamplingParams(), 0, output_ids=list(output))
    whole = request.token_ids
    assert request.tail == whole[-1]
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert request.tokens(start, end) == whole[start:end], (start, end)


def test_a_span_never_aliases_the_request_lists():
    request = Request("r", [1, 2], SamplingParams(), 0, output_ids=[3])
    request.tokens(0, 2).append(99)
    request.tokens(2, 3).append(99)
    assert request.token_ids == [1, 2, 3]


CONFIGS = [{}, {"max_num_batched_tokens": 512},
           {"enable_chunked_prefill": False, "max_num_batched_tokens": 512, "max_model_len": 512}]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_the_server_admits_what_the_scheduler_admits(config):
    """Admission.validate applies the scheduler's own rule (a pure function of the prompt
    length and the limits), without a scheduler of its own: the same verdict at every
    length around the limits."""
    import generated
    from runtime.core.config import EngineConfig
    from runtime.core.sampling_params import InvalidParam
    from runtime.planning.admission import Admission

    admission = Admission.plan(EngineConfig(spec="reference", **{"max_model_len": 4096, **config}),
                               generated.load("reference"))
    scheduler, limits = admission.scheduler(), admission.limits
    edges = {limits.max_model_len, limits.effective_extent}
    for n in sorted({m + d for m in edges for d in (-2, -1, 0, 1)} | {1, 100}):
        ids = [1] * n
        want = scheduler.check(Request("r", ids, SamplingParams(), 0))
        try:
            admission.validate(ids, SamplingParams())
            got = None
        except InvalidParam as exc:
            got = exc
        assert (got is None) == (want is None), (n, want, got)
        assert got is None or want in str(got), (n, want, got)
