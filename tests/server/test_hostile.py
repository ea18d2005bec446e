"""Hostile request bodies: each gets a 400 (naming the field where one is at fault) and
leaves the server healthy for everyone else; a fault in one request's sampling fails
that request alone while eight others stream on."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from runtime.core.sampling_params import SamplingParams
from runtime.sampling import batch_sampler
from tests.runtime.engine_support import assert_all_free, make_engine

pytestmark = pytest.mark.slow

COMPLETION = '{"model": "tiny", "prompt": "t5 t6", "max_tokens": 2, %s}'
CHAT = '{"messages": [{"role": "user", "content": "t5 t6"}], "max_tokens": 2, %s}'
FLOAT_FIELDS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty"]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", '"NaN"', '"-inf"']


def _cases() -> list[tuple[str, str, bytes, str | None]]:
    """(id, path, raw body, the `param` the 400 must name or None for the body)."""
    cases = []
    for path, template in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        short = "chat" if "chat" in path else "completions"
        for field in FLOAT_FIELDS:
            for literal in NON_FINITE:
                body = template % f'"{field}": {literal}'
                cases.append((f"{short}-{field}={literal}", path, body.encode(), field))
        bias = template % '"logit_bias": {"5": NaN}'
        cases.append((f"{short}-logit_bias-nan", path, bias.encode(), "logit_bias.5"))
        cases += [(f"{short}-{name}", path, (template % field).encode(), param)
                  for name, field, param in _RANGES]
    cases += [(name, path, body, param) for name, path, body, param in _BODIES]
    return cases


_RANGES = [   # (id, field text, param) for both endpoints
    ("seed-2**80", f'"seed": {2**80}', "seed"),
    ("seed-negative-2**64", f'"seed": {-2**64}', "seed"),
    ("top_k=-2", '"top_k": -2', "top_k"),
    ("top_k=10**30", f'"top_k": {10**30}', "top_k"),          # beyond int64: not sendable
    ("n=1000", '"n": 1000', "n"),
    ("n=0", '"n": 0', "n"),
    ("max_tokens=-1", '"max_tokens": -1', "max_tokens"),
    ("max_tokens=10**30", f'"max_tokens": {10**30}', "max_tokens"),
    ("stop_token_ids-negative", '"stop_token_ids": [-1]', "stop_token_ids"),
    ("stop_token_ids-huge", f'"stop_token_ids": [{10**20}]', "stop_token_ids"),
    ("stop_token_ids-strings", '"stop_token_ids": ["a"]', "stop_token_ids[0]"),
    ("stop-empty", '"stop": [""]', "stop"),
    ("stop-ints", '"stop": [1, 2]', "stop[0]"),
    ("logit_bias-outside-vocab", '"logit_bias": {"99999": 1}', "logit_bias"),
    ("logit_bias-key-not-id", '"logit_bias": {"abc": 1}', "logit_bias"),
    ("logit_bias-101", '"logit_bias": {"5": 101}', "logit_bias"),
    ("logit_bias-string-value", '"logit_bias": {"5": "x"}', "logit_bias.5"),
    ("temperature-word", '"temperature": "hot"', "temperature"),
    ("temperature-negative", '"temperature": -1', "temperature"),
    ("top_p-zero", '"top_p": 0', "top_p"),
    ("top_p-two", '"top_p": 2', "top_p"),
    ("min_p-above-one", '"min_p": 1.5', "min_p"),
    ("repetition_penalty-zero", '"repetition_penalty": 0', "repetition_penalty"),
    ("presence_penalty-3", '"presence_penalty": 3', "presence_penalty"),
    ("frequency_penalty--3", '"frequency_penalty": -3', "frequency_penalty"),
    # the limits on per-token work (--max-stop-strings, --max-stop-token-ids)
    ("stop-65-strings", '"stop": ' + json.dumps([f"s{i}" for i in range(65)]), "stop"),
    ("stop-string-1025-chars", '"stop": ' + json.dumps(["x" * 1025]), "stop"),
    ("stop_token_ids-1025", '"stop_token_ids": ' + json.dumps([7] * 1025), "stop_token_ids"),
]
_C, _CH = "/v1/completions", "/v1/chat/completions"
_BODIES = [
    ("deep-brackets", _C, b"[" * 100_000, None),
    ("deep-objects", _C, b'{"a":' * 50_000, None),
    ("deep-prompt", _C, b'{"prompt": ' + b"[" * 100 + b"5" + b"]" * 100 + b"}", None),
    ("deep-content", _CH, b'{"messages": [{"role": "user", "content": [' + b"[" * 80
     + b"]" * 80 + b"]}]}", None),
    ("not-utf8", _C, b'{"prompt": "t5 \xff\xfe"}', None),
    ("latin-1", _C, '{"prompt": "caf\u00e9"}'.encode("latin-1"), None),
    ("utf-16", _C, '{"prompt": "t5"}'.encode("utf-16"), None),
    ("lone-surrogate-prompt", _C, b'{"prompt": "t5 \\ud800"}', None),
    ("lone-surrogate-chat", _CH, b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
     None),
    ("huge-integer", _C, b'{"prompt": "t5", "max_tokens": 1' + b"0" * 5000 + b"}", None),
    ("empty-body", _C, b"", None),
    ("null-body", _C, b"null", None),
    ("prompt-mixed-list", _C, b'{"prompt": ["t5", 1]}', "prompt[1]"),
    ("prompt-ids-with-string", _C, b'{"prompt": [[1, "a"]]}', "prompt[0][1]"),
    ("best_of-1000", _C, b'{"prompt": "t5", "best_of": 1000}', "best_of"),
    ("best_of-below-n", _C, b'{"prompt": "t5", "n": 2, "best_of": 1}', "best_of"),
    ("best_of-streamed", _C, b'{"prompt": "t5", "best_of": 2, "stream": true}', "best_of"),
    ("logprobs-21", _C, b'{"prompt": "t5", "logprobs": 21}', "logprobs"),
    ("logprobs-negative", _C, b'{"prompt": "t5", "logprobs": -1}', "logprobs"),
    ("top_logprobs-21", _CH, b'{"messages": [{"role": "user", "content": "t5"}], '
     b'"logprobs": true, "top_logprobs": 21}', "top_logprobs"),
    ("messages-strings", _CH, b'{"messages": ["hi"]}', "messages[0]"),
    ("content-part-int-text", _CH, b'{"messages": [{"role": "user", "content": '
     b'[{"type": "text", "text": 5}]}]}', "messages[0].content[0].text"),
    ("content-part-image", _CH, b'{"messages": [{"role": "user", "content": '
     b'[{"type": "image_url", "image_url": {"url": "x"}}]}]}', "messages"),
    ("role-int", _CH, b'{"messages": [{"role": 5, "content": "t5"}]}', "messages[0].role"),
    ("prompt-id-outside-vocab", _C, b'{"prompt": [5, 999999]}', "prompt[1]"),
    # more prompts than --max-prompts-per-request; text refused for its size, unencoded
    ("prompts-257", _C, json.dumps({"prompt": ["t5"] * 257}).encode(), "prompt"),
    ("prompt-4-MiB", _C, b'{"prompt": "' + b"t5 " * (4 << 18) + b'"}', "prompt"),
    ("messages-4-MiB", _CH, b'{"messages": [{"role": "user", "content": "'
     + b"t5 " * (4 << 18) + b'"}]}', "messages"),
    ("batch-prompt-id-outside-vocab", _C, b'{"prompt": [[5], [5, -1]]}', "prompt[1][1]"),
]
CASES = _cases()


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def test_there_are_enough_hostile_bodies():
    assert len(CASES) >= 25


@pytest.mark.parametrize(("path", "body", "param"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_hostile_body_is_a_400_and_the_server_serves_on(http, path, body, param):
    resp = http.post(path, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    if param is not None:
        assert error["param"] == param, error
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json={"prompt": "t5 t6", "max_tokens": 2,
                                            "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_best_of_returns_the_n_most_likely_candidates(http):
    body = {"prompt": "t5 t6 t7", "max_tokens": 4, "temperature": 1.0, "seed": 11}
    candidates = http.post("/v1/completions", json={**body, "n": 4, "logprobs": 0}).json()
    totals = [sum(c["logprobs"]["token_logprobs"]) for c in candidates["choices"]]
    best = http.post("/v1/completions", json={**body, "n": 2, "best_of": 4}).json()
    ranked = sorted(range(4), key=lambda i: -totals[i])[:2]
    assert [c["text"] for c in best["choices"]] == \
        [candidates["choices"][i]["text"] for i in ranked]
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in best["choices"])


# -- one request's fault ---------------------------------------------------------------

FAULTY_PROMPT = "t9 t9 t9 t9"
MARK = 424242        # the seed that marks the faulty request
HEALTHY = [f"t{5 + i} t{20 + 3 * i} t{40 + i}" for i in range(8)]
GREEDY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}


def _streamed(http, path, body) -> tuple[str, list[dict]]:
    """The joined text of a streamed completion and any error events."""
    text, errors = "", []
    with http.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                errors.append(event["error"])
            else:
                text += event["choices"][0].get("text", "")
    return text, errors


@pytest.fixture
def faulty_sampling(monkeypatch):
    """The rows of a request seeded MARK come out unsound (NaN) from its third token."""
    real = batch_sampler.adjusted

    def patched(logits, rows, *args):
        out = real(logits, rows, *args)
        return torch.where(((rows.seed == MARK) & (rows.counter >= 2))[:, None],
                           float("nan"), out)

    monkeypatch.setattr(batch_sampler, "adjusted", patched)


def test_a_sampling_fault_fails_one_stream_while_eight_finish(live, http, params,
                                                              faulty_sampling):
    from concurrent.futures import ThreadPoolExecutor

    path = "/v1/completions"
    bodies = [{"prompt": FAULTY_PROMPT, "seed": MARK, **GREEDY}] + \
        [{"prompt": p, **GREEDY} for p in HEALTHY]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: _streamed(http, path, b), bodies))
    (_, errors), healthy = results[0], results[1:]
    assert len(errors) == 1 and errors[0]["code"] == 500
    assert errors[0]["type"] == "InternalServerError" and "finite" in errors[0]["message"]
    want = make_engine(params).generate(HEALTHY, SamplingParams(**GREEDY))
    assert [text for text, _ in healthy] == [o.text for o in want]
    assert all(not errs for _, errs in healthy)
    resp = http.post(path, json={"prompt": FAULTY_PROMPT, "seed": MARK, **GREEDY})
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "InternalServerError"
    assert http.get("/health").status_code == 200
    live.engine.run_locked(assert_all_free)


def test_a_bug_while_answering_is_a_shaped_500_and_the_server_serves_on(live, http,
                                                                        monkeypatch):
    import server.app

    def broken(*args):
        raise KeyError("injected")

    monkeypatch.setattr(server.app, "completion_response", broken)
    monkeypatch.setattr(server.app, "completion_chunk", broken)
    resp = http.post("/v1/completions", json={"prompt": "t5", "max_tokens": 2})
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "InternalServerError"
    long = {"prompt": "t5", "max_tokens": 500, "ignore_eos": True}
    _, errors = _streamed(http, "/v1/completions", long)
    assert [e["code"] for e in errors] == [500]
    live.engine.run_locked(assert_all_free)        # the failed stream's request was aborted
    monkeypatch.undo()
    assert http.post("/v1/completions", json={"prompt": "t5", "max_tokens": 2,
                                              "ignore_eos": True}).status_code == 200
