"""One request, however hostile or heavy, is its own business, against the server as
`make serve` runs it (the engine in a core process of its own): the bodies that once
stopped the engine complete, and the heaviest valid requests (an 8 MiB prompt, a
full-vocabulary logit_bias, the longest stop lists, a body of as many sequences as a
request may start, /tokenize at the body-size limit and at max_model_len, top-20
log-probs over every token of many choices) leave the other streams' inter-token
latency where it was (their work is bounded per request, a body's requests take turns
with the others', and what grows with their size runs off the event loop)."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.server.support import ServerProcess

pytestmark = pytest.mark.slow

VOCAB = 512                            # the reference checkpoint's
STREAMS = [f"t{5 + i} t{20 + 3 * i} t{40 + i}" for i in range(8)]
TOKENS = 48
SEQS, MAX_N = 32, 32                   # --max-num-seqs (and so the most n), rows per step
LIMIT = 256 * MAX_N                    # --max-sequences-per-request: 256 prompts x n 32
HOSTILE = [   # each passed validation and then stopped the shared step
    {"seed": -1, "temperature": 1}, {"seed": -(2**63), "temperature": 1},
    {"n": 2, "seed": 2**63 - 1, "temperature": 1}, {"top_k": 5000, "temperature": 1},
    {"top_k": 10**9}]


@pytest.fixture(scope="module")
def server():
    """One token per step (no MTP); bodies up to 16 MiB, so that an 8 MiB prompt is
    read; 32 rows a step (steps as costly whatever fills them: the companions and their
    twins both fill them); the engine core's torch on one thread, so that on a 2-core
    machine the API server has a core of its own, as it has beside a GPU engine (else
    any work of the server's, however short, stalls a step whose two threads wait for
    each other)."""
    with ServerProcess("--num-speculative-tokens", "0", "--max-body-bytes", str(16 << 20),
                       "--max-num-seqs", str(SEQS), "--max-sequences-per-request", str(LIMIT),
                       env={"OMP_NUM_THREADS": "1"}) as running:
        yield running


@pytest.mark.parametrize("fields", HOSTILE, ids=lambda f: json.dumps(f))
def test_a_body_that_once_stopped_the_engine_completes(server, fields):
    body = {"model": "tiny", "prompt": "t5 t6", "max_tokens": 4, "ignore_eos": True, **fields}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    assert len(choices) == fields.get("n", 1)
    assert all(c["finish_reason"] == "length" for c in choices)
    assert resp.json()["usage"]["completion_tokens"] == 4 * len(choices)
    assert httpx.get(f"{server.url}/health").status_code == 200


def _gaps(url: str, prompt: str) -> list[float]:
    """Seconds between the chunks of a greedy stream (one token each, unless the server
    fell behind: a stream's news not yet sent go out merged, one chunk)."""
    body = {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    times, used = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(time.perf_counter())
                used = chunk.get("usage") or used
    assert used["completion_tokens"] == TOKENS
    return list(np.diff(times))


def _companions(url: str, heavy: bool) -> list:
    """Request senders (each takes the Event set when the streams are done), heavy or
    their ordinary twins: an 8 MiB prompt (refused: too long for max_model_len) or a
    2-token one refused for its max_tokens; a full-vocabulary logit_bias and the longest
    stop lists (both run to the end) or none; /tokenize of a prompt that fills the 16 MiB
    body (refused without encoding it whole) and of one of max_model_len tokens, or of
    two tokens; 16 chat choices with top-20 log-probs at every token, or without; a
    streamed body of LIMIT requests (256 prompts x n 32, one token each, read until the
    streams are done, then closed: the rest aborted), or one of n 6 (its rows)."""
    huge = " ".join(f"t{i % 500}" for i in range(2_000_000))[: 8 << 20]
    refused = {"prompt": huge, "max_tokens": 4} if heavy else \
        {"prompt": "t5 t6", "max_tokens": 10**6}
    bias = {"prompt": "t7 t8", "max_tokens": TOKENS, "seed": 3, "ignore_eos": True}
    stops = {"prompt": "t9 t10", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "t11 t12"}], "max_tokens": TOKENS - 8,
            "n": 16, "seed": 2, "ignore_eos": True}
    fan = {"prompt": "t13 t14", "n": 6, "max_tokens": 10 * TOKENS, "ignore_eos": True,
           "stream": True}
    tokenize = [{"prompt": "t5 t6"}, {"prompt": "t5"}]
    if heavy:
        bias["logit_bias"] = {str(t): (t % 7 - 3) / 2 for t in range(VOCAB)}
        stops.update(stop=[f"{i:02d}" + "zq" * 511 for i in range(64)],
                     stop_token_ids=[0] * 1024)
        chat.update(logprobs=True, top_logprobs=20)
        fan = {"prompt": [[5 + i, 6] for i in range(256)], "n": MAX_N, "max_tokens": 1,
               "stream": True}
        full = " ".join(f"t{i % 500}" for i in range(3_000_000))[: (16 << 20) - 64]
        tokenize = [{"prompt": full}, {"prompt": " ".join(["t7"] * 16_000)}]

    def post(path: str, body: dict, status: int, stream: bool = False):
        content = json.dumps(body).encode()
        headers = {"content-type": "application/json"}

        def send(done: threading.Event) -> None:
            if not stream:
                resp = httpx.post(f"{url}{path}", content=content, timeout=120,
                                  headers=headers)
                assert resp.status_code == status, resp.text[:300]
                return
            with httpx.stream("POST", f"{url}{path}", content=content, timeout=120,
                              headers=headers) as resp:
                assert resp.status_code == status
                for _ in resp.iter_bytes():
                    if done.is_set():
                        return                   # closed: what is unfinished is aborted
        return send

    return [post("/v1/completions", refused, 400), post("/v1/completions", bias, 200),
            post("/v1/completions", stops, 200),
            post("/tokenize", tokenize[0], 400 if heavy else 200),
            post("/tokenize", tokenize[1], 200), post("/v1/chat/completions", chat, 200),
            post("/v1/completions", fan, 200, stream=True)]


def _p99(url: str, companions: list) -> float:
    """The p99 gap of 8 concurrent streams, the companions sent while they run."""
    done = threading.Event()
    with ThreadPoolExecutor(len(STREAMS) + len(companions)) as pool:
        streams = [pool.submit(_gaps, url, p) for p in STREAMS]
        time.sleep(0.3)                   # the streams are decoding
        sent = [pool.submit(send, done) for send in companions]
        gaps = [g for f in streams for g in f.result()]
        done.set()
        for f in sent:
            f.result()
    return float(np.percentile(gaps, 99))


def test_the_heaviest_requests_leave_the_streams_latency_alone(server):
    """The streams' p99 inter-token latency beside the heavy requests within 2x of its
    value beside their ordinary twins (as many requests, as many rows to decode: what
    is measured is their weight), before and after, the larger taken: the machine is
    shared. (Beside no companions at all p99 is lower still: the twins add rows.)"""
    ordinary, heavy = _companions(server.url, False), _companions(server.url, True)
    before = _p99(server.url, ordinary)
    loaded = _p99(server.url, heavy)
    after = _p99(server.url, ordinary)
    assert loaded <= 2 * max(before, after), (before, loaded, after)
    assert httpx.get(f"{server.url}/health").status_code == 200
