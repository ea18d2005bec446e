"""Bad input gets a 400 (404 for an unknown model) with an OpenAI error object, never a
500 or a hang, and the server answers a normal request right after."""
from __future__ import annotations

import httpx
import pytest

from tests.model.support import reference_params
from tests.server.support import LiveServer

pytestmark = pytest.mark.slow

GOOD = {"model": "tiny", "prompt": "t5 t6", "max_tokens": 2, "temperature": 0}
CASES = {
    "invalid json": (b"{not json", None, 400),
    "not an object": (b"[1, 2]", None, 400),
    "missing prompt": ({"model": "tiny"}, "prompt", 400),
    "empty prompt": ({**GOOD, "prompt": ""}, "prompt", 400),
    "empty prompt list": ({**GOOD, "prompt": []}, "prompt", 400),
    "wrong type": ({**GOOD, "max_tokens": "ten"}, "max_tokens", 400),
    "wrong prompt type": ({**GOOD, "prompt": {"a": 1}}, "prompt", 400),
    "unknown model": ({**GOOD, "model": "gpt-9"}, "model", 404),
    "prompt too long": ({**GOOD, "prompt": list(range(2, 400)) * 50}, "prompt", 400),
    "max_tokens cannot fit": ({**GOOD, "max_tokens": 20000}, "max_tokens", 400),
    "max_tokens zero": ({**GOOD, "max_tokens": 0}, "max_tokens", 400),
    "logprobs too many": ({**GOOD, "logprobs": 21}, "logprobs", 400),
    "n below one": ({**GOOD, "n": 0}, "n", 400),
    "token id out of vocabulary": ({**GOOD, "prompt": [5, 512]}, "prompt[1]", 400),
    "negative token id": ({**GOOD, "prompt": [5, -1]}, "prompt[1]", 400),
    "stream_options without stream": ({**GOOD, "stream_options": {"include_usage": True}},
                                      "stream_options", 400),
    "temperature negative": ({**GOOD, "temperature": -1}, "temperature", 400),
    "oversized body": ({**GOOD, "prompt": "t5 " * 3_000_000}, None, 400),
}


@pytest.fixture(scope="module")
def live():
    with LiveServer(reference_params()) as server:
        yield server


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def _post(http, body, path="/v1/completions", **headers):
    if isinstance(body, bytes):
        return http.post(path, content=body, headers={"content-type": "application/json",
                                                      **headers})
    return http.post(path, json=body, headers=headers)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_completion_requests(http, case):
    body, param, status = CASES[case]
    resp = _post(http, body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    if param:
        assert error["param"] == param
    assert _post(http, GOOD).status_code == 200


def test_wrong_content_type(http):
    resp = http.post("/v1/completions", content=b'{"prompt": "t5"}',
                     headers={"content-type": "text/plain"})
    assert resp.status_code == 400 and "content-type" in resp.json()["error"]["message"]


def test_bad_chat_requests(http):
    assert _post(http, {"messages": []}, "/v1/chat/completions").status_code == 400
    bad_role = {"messages": [{"role": "wizard", "content": "t5"}]}
    resp = _post(http, bad_role, "/v1/chat/completions")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages[0].role"
    no_logprobs = {"messages": [{"role": "user", "content": "t5"}], "top_logprobs": 2}
    assert _post(http, no_logprobs, "/v1/chat/completions").status_code == 400


def test_tokenize_and_detokenize(http):
    ids = _post(http, {"prompt": "t5 t6"}, "/tokenize").json()
    assert ids["tokens"] == [5, 6] and ids["count"] == 2
    assert _post(http, {"tokens": [5, 6]}, "/detokenize").json() == {"prompt": "t5 t6"}
    assert _post(http, {"tokens": [9999]}, "/detokenize").status_code == 400


def test_unknown_route_and_method(http):
    assert http.get("/v2/nothing").status_code == 404
    assert http.get("/v1/completions").status_code == 405
