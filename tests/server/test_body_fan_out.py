"""One body's weight stays its own: the engine requests a body may start are bounded
(--max-sequences-per-request: a 400 naming n or best_of above it) and a body at the
bound completes; /tokenize is bounded like the completions routes (an overlong prompt
or conversation is a 400); whole responses' log-probs equal the streamed ones; and a
streaming client that does not read holds one pending output per choice while its
requests run to their end (runtime/engine/output_stream.py)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

import runtime.engine.async_engine as async_engine
from runtime.core.sampling_params import SamplingParams
from runtime.engine.output_stream import OutputStream
from server.app import build_app
from tests.runtime.engine_support import make_engine

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


@pytest.fixture
def limit(live):
    """The live server's --max-sequences-per-request lowered to 12 for one test."""
    before, live.state.max_sequences = live.state.max_sequences, 12
    yield 12
    live.state.max_sequences = before


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": ["t5", "t6", "t7"], "n": 5}, "n"),
    ({"prompt": [[5], [6], [7], [8], [9], [10], [11]], "n": 2}, "n"),
    ({"prompt": ["t5", "t6"], "n": 2, "best_of": 7}, "best_of")])
def test_a_body_over_the_sequence_limit_is_a_400_naming_its_field(http, limit, body, param):
    resp = http.post("/v1/completions", json={**body, "max_tokens": 2})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and "at most 12" in error["message"]


def test_a_chat_body_over_the_limit_is_a_400(http, limit):
    resp = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "t5"}], "n": 13, "max_tokens": 2})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


def test_a_body_at_the_limit_gets_every_choice(http, live, limit, params):
    prompts = [[5, 6], [7, 8, 9], [10]]
    resp = http.post("/v1/completions", json={"prompt": prompts, "n": 4, "max_tokens": 3,
                                              **GREEDY})
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    want = make_engine(params).generate(prompts, SamplingParams(max_tokens=3, **GREEDY))
    assert [c["index"] for c in choices] == list(range(12))
    assert [c["text"] for c in choices] == [w.text for w in want for _ in range(4)]
    assert resp.json()["usage"]["completion_tokens"] == 36
    assert live.engine.num_in_flight == 0


# -- /tokenize ------------------------------------------------------------------------------


def test_tokenize_refuses_a_prompt_over_max_model_len_without_encoding_it(http, live):
    limit = live.state.max_model_len
    huge = " ".join(f"t{i % 500}" for i in range(1_500_000))       # ~8 MB, 1.5M tokens
    started = time.perf_counter()
    resp = http.post("/tokenize", json={"prompt": huge})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert time.perf_counter() - started < 5
    fits = " ".join(f"t{i % 500}" for i in range(limit - 2))
    ids = http.post("/tokenize", json={"prompt": fits}).json()
    assert ids["count"] == len(ids["tokens"]) <= limit and ids["max_model_len"] == limit
    over = http.post("/tokenize", json={"prompt": fits + " t1 t2 t3"})
    assert over.status_code == 400 and str(limit) in over.json()["error"]["message"]


def test_tokenize_refuses_a_conversation_over_max_model_len(http):
    content = " ".join(f"t{i % 500}" for i in range(400_000))
    resp = http.post("/tokenize", json={"messages": [{"role": "user", "content": content}]})
    assert resp.status_code == 400
    small = http.post("/tokenize", json={"messages": [{"role": "user", "content": "t5"}]})
    assert small.status_code == 200 and small.json()["count"] == len(small.json()["tokens"])


# -- log-probs -----------------------------------------------------------------------------


def _streamed(http, path: str, body: dict) -> dict[int, list]:
    """Each choice's chunks' log-probs, in order."""
    got: dict[int, list] = {}
    with http.stream("POST", path, json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    if choice["logprobs"]:
                        got.setdefault(choice["index"], []).append(choice["logprobs"])
    return got


def test_whole_completion_log_probs_equal_the_streamed_ones(http):
    body = {"prompt": "t5 t6", "max_tokens": 12, "n": 3, "logprobs": 5, "seed": 4,
            "temperature": 1, "ignore_eos": True}
    whole = http.post("/v1/completions", json=body).json()["choices"]
    streamed = _streamed(http, "/v1/completions", body)
    for choice in whole:
        parts = streamed[choice["index"]]
        lp = choice["logprobs"]
        joined = {key: [x for part in parts for x in part[key]] for key in lp}
        assert lp["tokens"] == joined["tokens"]      # log-probs: as a batch computes them
        assert lp["token_logprobs"] == pytest.approx(joined["token_logprobs"], abs=1e-4)
        for top, want in zip(lp["top_logprobs"], joined["top_logprobs"], strict=True):
            assert top == pytest.approx(want, abs=1e-4)
        assert lp["text_offset"][0] == 0 and len(lp["tokens"]) == 12
        assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(12)]


def test_whole_chat_log_probs_equal_the_streamed_ones(http):
    body = {"messages": [{"role": "user", "content": "t5"}], "max_tokens": 10, "n": 2,
            "logprobs": True, "top_logprobs": 4, "seed": 9, "temperature": 1,
            "ignore_eos": True}
    whole = http.post("/v1/chat/completions", json=body).json()["choices"]
    streamed = _streamed(http, "/v1/chat/completions", body)
    for choice in whole:
        content = choice["logprobs"]["content"]
        joined = [x for part in streamed[choice["index"]] for x in part["content"]]
        assert [e["token"] for e in content] == [e["token"] for e in joined]
        assert [e["logprob"] for e in content] == \
            pytest.approx([e["logprob"] for e in joined], abs=1e-4)
        assert len(content) == 10 and all(len(e["top_logprobs"]) == 4 for e in content)
        assert all(e["bytes"] == list(e["token"].encode()) for e in content)


def test_best_of_keeps_the_best_and_shows_log_probs_only_when_asked(http):
    body = {"prompt": "t5 t6", "max_tokens": 6, "n": 2, "best_of": 5, "seed": 1,
            "temperature": 1.5, "ignore_eos": True}
    plain = http.post("/v1/completions", json=body).json()["choices"]
    assert [c["index"] for c in plain] == [0, 1] and all(c["logprobs"] is None for c in plain)
    shown = http.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"]
    totals = [sum(c["logprobs"]["token_logprobs"]) for c in shown]
    assert totals == sorted(totals, reverse=True)
    assert [c["text"] for c in shown] == [c["text"] for c in plain]


# -- a client that does not read ------------------------------------------------------------


class _Recorded(OutputStream):
    """An OutputStream that keeps count of the outputs put and the most held unread."""

    made: list[_Recorded] = []

    def __init__(self, loop):
        super().__init__(loop)
        self.puts, self.most = 0, 0
        _Recorded.made.append(self)

    def put(self, output) -> bool:
        woken = super().put(output)
        self.puts += 1
        self.most = max(self.most, self.pending())
        return woken


async def _stalled_client(app, body: dict, engine, read_after: int) -> list[bytes]:
    """The app's SSE for `body` to a client whose socket is full after `read_after` body
    chunks (each write after that waits, as uvicorn's send does while the socket does not
    drain) until the engine has finished the body's requests; then everything."""
    drained, sent, asked = asyncio.Event(), [], []

    async def receive():
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": json.dumps(body).encode(),
                    "more_body": False}
        await asyncio.Event().wait()                   # no disconnect

    async def send(message):
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))
            if len(sent) >= read_after:
                await drained.wait()

    async def release():
        while len(sent) < read_after or engine.num_in_flight:   # the requests ran on
            await asyncio.sleep(0.02)
        release.stalled = len(sent)
        drained.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": ""}
    waiter = asyncio.create_task(release())
    await asyncio.wait_for(app(scope, receive, send), 120)
    await waiter
    return sent, release.stalled


def test_a_client_that_does_not_read_holds_one_output_per_choice(live, params, monkeypatch):
    monkeypatch.setattr(async_engine, "OutputStream", _Recorded)
    _Recorded.made.clear()
    n, tokens = 8, 40
    body = {"prompt": "t5 t6", "max_tokens": tokens, "n": n, "logprobs": 3, "stream": True,
            **GREEDY}
    sent, stalled = asyncio.run(_stalled_client(build_app(live.state), body, live.engine, 4))
    [stream] = _Recorded.made
    assert stalled == 4                   # nothing more was written while the requests ran
    assert stream.most <= n and stream.puts >= tokens * n / 2     # merged, never queued
    text: dict[int, str] = {}
    counted: dict[int, int] = {}
    for chunk in b"".join(sent).decode().split("\n\n"):
        if chunk.startswith("data: {"):
            for choice in json.loads(chunk[6:])["choices"]:
                text[choice["index"]] = text.get(choice["index"], "") + choice["text"]
                counted[choice["index"]] = counted.get(choice["index"], 0) + \
                    len((choice["logprobs"] or {}).get("tokens", []))
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")
    [want] = make_engine(params).generate(["t5 t6"], SamplingParams(max_tokens=tokens,
                                                                    **GREEDY))
    assert text == dict.fromkeys(range(n), want.text)
    assert counted == dict.fromkeys(range(n), tokens)
