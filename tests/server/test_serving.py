"""Serving under load and faults: concurrent streams with disconnects, metrics, health,
info, auth, and a dead engine."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.core.sampling_params import SamplingParams
from tests.runtime.engine_support import make_engine
from tests.server.support import LiveServer

pytestmark = pytest.mark.slow

NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:num_preemptions", "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos", "v4serve:dispatches",
    "v4serve:pool_usage_perc", "v4serve:spec_decode_steps",
}


def _metrics(url: str) -> dict[str, list]:
    text = httpx.get(f"{url}/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(metrics: dict, name: str) -> float:
    return sum(s.value for s in metrics[name])


def _prompt(i: int) -> list[int]:
    return [5 + i % 50, 6, 7] * (1 + i % 40)


async def _stream(client: httpx.AsyncClient, i: int, disconnect: bool) -> tuple[int, str, str]:
    body = {"model": "tiny", "prompt": _prompt(i), "max_tokens": 24,
            "temperature": 0, "stream": True, "ignore_eos": True}
    text, reason = "", None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            reason = choice["finish_reason"] or reason
            if disconnect and text.count(" ") >= 3:
                break
    return i, text, reason


def test_64_streams_with_16_disconnects(params):
    with LiveServer(params) as live:
        async def main():
            async with httpx.AsyncClient(base_url=live.url, timeout=120) as client:
                return await asyncio.gather(*(_stream(client, i, i % 4 == 0) for i in range(64)))

        results = asyncio.run(main())
        finished = [r for r in results if r[0] % 4]
        assert len(finished) == 48 and all(r[2] == "length" for r in finished)
        offline = make_engine(params).generate(
            [_prompt(i) for i, _, _ in finished],
            SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        assert [text for _, text, _ in finished] == [o.text for o in offline]
        metrics = _metrics(live.url)
        assert NAMES <= set(metrics)
        assert _value(metrics, "vllm:num_requests_running") == 0
        assert _value(metrics, "vllm:num_requests_waiting") == 0
        assert _value(metrics, "vllm:kv_cache_usage_perc") == 0
        assert _value(metrics, "v4serve:pool_usage_perc") == 0
        assert _value(metrics, "vllm:generation_tokens") >= 48 * 24
        assert _value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos") \
            == _value(metrics, "vllm:spec_decode_num_accepted_tokens")
        assert {s.labels["k"] for s in metrics["v4serve:spec_decode_steps"]} == {"1"}
        assert live.engine.num_in_flight == 0


def test_health_info_version_and_auth(params):
    with LiveServer(params, api_key="s3cret") as live:
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/version").json()["version"]
        # /server_info names paths, hosts and pids: behind the key
        assert httpx.get(f"{live.url}/server_info").status_code == 401
        info = httpx.get(f"{live.url}/server_info",
                         headers={"authorization": "Bearer s3cret"}).json()
        assert info["spec"] == "reference" and info["topology"]["ranks"] == 8
        assert info["decode_layouts"]["1"]["kernel"] == "decode_b4s2"
        assert info["pool_capacity"]["tokens_per_rank"] > 0 and info["mtp"]["enabled"]
        assert info["pool_capacity"]["max_concurrency"] > 0 and info["backend"] == "torch"
        assert info["param_bytes_per_rank"] > 0 and info["checkpoint"].endswith("v4-tiny")
        body = {"model": "tiny", "prompt": "t5", "max_tokens": 1}
        for headers in ({}, {"authorization": "Bearer s3creT"}, {"authorization": "s3cret"},
                        {"authorization": "Bearer s3cr\xe9t".encode("latin-1")}):
            denied = httpx.post(f"{live.url}/v1/completions", json=body, headers=headers)
            assert denied.status_code == 401 and denied.json()["error"]["code"] == 401
        ok = httpx.post(f"{live.url}/v1/completions", json=body,
                        headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        live.state.ready = False
        assert httpx.get(f"{live.url}/health").status_code == 503


def test_a_dead_engine_fails_requests_and_health(params):
    with LiveServer(params) as live:
        def boom():
            raise RuntimeError("device lost")

        live.engine.engine.step = boom
        resp = httpx.post(f"{live.url}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "t5", "max_tokens": 3})
        assert resp.status_code == 503 and "device lost" in resp.json()["error"]["message"]
        assert httpx.get(f"{live.url}/health").status_code == 503
        again = httpx.post(f"{live.url}/v1/completions", timeout=30,
                           json={"model": "tiny", "prompt": "t5", "max_tokens": 3})
        assert again.status_code == 503
