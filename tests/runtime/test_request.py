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
