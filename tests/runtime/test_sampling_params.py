"""SamplingParams refuses every value outside its domain, naming the field: non-finite
floats, out-of-range numbers, empty stop strings, seeds beyond 64 bits."""
from __future__ import annotations

import math

import pytest

from runtime.core.sampling_params import SEED_MAX, SEED_MIN, InvalidParam, SamplingParams

FLOATS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty"]
OUT_OF_RANGE = [
    ("max_tokens", 0), ("max_tokens", -5),
    ("temperature", -0.01),
    ("top_p", 0.0), ("top_p", 1.0001),
    ("top_k", -2),
    ("min_p", -0.1), ("min_p", 1.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -2.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("seed", SEED_MAX + 1), ("seed", SEED_MIN - 1), ("seed", 2**80),
    ("stop", ("",)), ("stop", ("ok", "")),
    ("stop_token_ids", (-1,)),
    ("logprobs", -1),
    ("logit_bias", ((5, 100.5),)), ("logit_bias", ((-1, 1.0),)),
    ("logit_bias", ((5, math.nan),)),
]
IN_RANGE = [
    ("temperature", 0.0), ("top_p", 1.0), ("top_p", 1e-9), ("top_k", -1), ("top_k", 0),
    ("top_k", 1), ("min_p", 0.0), ("min_p", 1.0), ("presence_penalty", -2.0),
    ("frequency_penalty", 2.0), ("repetition_penalty", 1e-3), ("seed", SEED_MIN),
    ("seed", SEED_MAX), ("logprobs", 0), ("logit_bias", ((0, -100.0), (7, 100.0))),
]


@pytest.mark.parametrize("field", FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_by_name(field, value):
    with pytest.raises(InvalidParam, match=f"^{field} must be a finite number") as err:
        SamplingParams(**{field: value})
    assert err.value.param == field


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_values_are_refused_by_name(field, value):
    with pytest.raises(InvalidParam) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field and field in str(err.value)


@pytest.mark.parametrize(("field", "value"), IN_RANGE)
def test_the_edges_of_each_range_are_accepted(field, value):
    assert getattr(SamplingParams(**{field: value}), field) == value


def test_booleans_are_not_numbers():
    with pytest.raises(InvalidParam, match="temperature"):
        SamplingParams(temperature=True)
    with pytest.raises(InvalidParam, match="max_tokens"):
        SamplingParams(max_tokens=True)


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty",
                                   "presence_penalty"])
def test_an_integer_beyond_a_double_is_refused_not_an_overflow(field):
    with pytest.raises(InvalidParam, match=field) as caught:
        SamplingParams(**{field: 10**400})
    assert caught.value.param == field
    with pytest.raises(InvalidParam, match="logit_bias"):
        SamplingParams(logit_bias=((5, -(10**400)),))


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", 2**63), ("top_k", 2**63), ("seed", 2**63), ("logprobs", 2**63),
    ("stop_token_ids", (5, 2**63)), ("logit_bias", ((2**63, 1.0),))])
def test_every_integer_fits_an_int64(field, value):
    """Integers travel as int64 (msgpack to the engine core, tensors on the device): one
    beyond is refused here, naming its field, not by an overflow downstream."""
    with pytest.raises(InvalidParam) as caught:
        SamplingParams(**{field: value})
    assert caught.value.param == field
