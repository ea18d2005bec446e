"""logit_bias keys are token ids in canonical decimal, one spelling per id: "05" beside "5"
would bias token 5 twice (their biases added up, past the +-100 a key may give). Any other
spelling is a 400 naming logit_bias; so is a token given twice to SamplingParams."""
from __future__ import annotations

import httpx
import pytest

from runtime.core.sampling_params import InvalidParam, SamplingParams
from server.protocol import APIError, ChatCompletionRequest, CompletionRequest

ENDPOINTS = ((CompletionRequest, {"prompt": "t5"}),
             (ChatCompletionRequest, {"messages": [{"role": "user", "content": "t5"}]}))


@pytest.mark.parametrize("bias", [
    {"05": 1}, {"005": -1}, {"5": 1, "05": 1}, {"00": 1}, {"+5": 1}, {"-0": 1}, {" 5": 1},
    {"5 ": 1}, {"5.0": 1}, {"\u0665": 1}, {"\uff15": 1}, {"0x5": 1}, {"": 1}, {"1_0": 1},
    {"0" * 19 + "5": 1}])
def test_a_key_not_in_canonical_decimal_is_a_400(bias):
    for model, fields in ENDPOINTS:
        req = model.model_validate({**fields, "logit_bias": bias})
        with pytest.raises(APIError) as err:
            req.sampling(4, None)
        assert err.value.status == 400 and err.value.param == "logit_bias"
        assert "leading zeros" in err.value.message


def test_canonical_keys_are_taken_once_each():
    for model, fields in ENDPOINTS:
        req = model.model_validate({**fields, "logit_bias": {"50": 2, "0": -1, "5": 1,
                                                             "123456789": 0.5}})
        assert req.sampling(4, None).logit_bias == ((0, -1.0), (5, 1.0), (50, 2.0),
                                                    (123456789, 0.5))


def test_sampling_params_refuse_a_token_biased_twice():
    with pytest.raises(InvalidParam, match="token 5 more than once") as err:
        SamplingParams(logit_bias=((5, 1.0), (7, 2.0), (5, 1.0)))
    assert err.value.param == "logit_bias"
    assert SamplingParams(logit_bias=((5, 1.0), (7, 2.0))).logit_bias == ((5, 1.0), (7, 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_second_spelling_of_a_token_is_a_400_through_http(live, path):
    body = {"prompt": [5], "messages": [{"role": "user", "content": "t5"}], "max_tokens": 1,
            "logit_bias": {"5": 100, "05": 100}}
    answer = httpx.post(f"{live.url}{path}", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "logit_bias" and "leading zeros" in error["message"]
    assert httpx.post(f"{live.url}{path}", json={**body, "logit_bias": {"5": 100}},
                      timeout=60).status_code == 200
