"""The official openai client against a live server: completions, chat, streaming."""
from __future__ import annotations

import openai
import pytest

from tests.model.support import FIXTURE_TOL, golden
from tests.runtime.engine_support import make_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


PROMPT = "t5 t6 t7 t8"


def _greedy_text(params, prompt: str, max_tokens: int) -> str:
    from runtime.core.sampling_params import SamplingParams

    engine = make_engine(params)
    [out] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens))
    return out.text


def test_completion_is_the_engines_greedy_text(client, params):
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    assert resp.choices[0].text == _greedy_text(params, PROMPT, 8)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == 4 and resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == 12


def test_streamed_text_joins_to_the_non_streamed_text(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert all(c.usage is None for c in chunks)


def test_include_usage_adds_one_final_usage_chunk(client):
    chunks = list(client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_n_choices_differ_and_a_seed_reproduces_them(client):
    """Choice j samples with seed + j: the choices differ from each other, the same seed
    gives the same choices again, another seed other ones."""
    def texts(seed: int) -> list[str]:
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True})
        assert sorted(c.index for c in resp.choices) == [0, 1, 2]
        assert resp.usage.prompt_tokens == 4 and resp.usage.completion_tokens == 24
        return [c.text for c in sorted(resp.choices, key=lambda c: c.index)]

    first = texts(1)
    assert texts(1) == first and len(set(first)) == 3
    assert texts(2) != first


def test_a_seed_over_http_repeats_and_another_differs(client):
    def text(seed: int | None, endpoint: str = "completions") -> str:
        if endpoint == "chat":
            return client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                temperature=1.0, seed=seed).choices[0].message.content
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8,
                                         temperature=1.0, seed=seed).choices[0].text

    for endpoint in ("completions", "chat"):
        assert text(11, endpoint) == text(11, endpoint)
        assert text(11, endpoint) != text(12, endpoint)
    assert len({text(None) for _ in range(3)}) > 1          # unseeded: a fresh stream each


def test_stop_string_and_stop_reason(client, params):
    text = _greedy_text(params, PROMPT, 8)
    stop = text.split()[3]
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                     stop=[stop])
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop
    assert choice.text == text[: text.index(stop)]


def test_logprobs_are_the_official_ones(client, live):
    """Over HTTP, the fixture's prompts: the greedy tokens and, at every generated
    position, the sampled token's and the top-5 log-probs computed by the official V4
    inference code (tests/fixtures/v4-tiny/golden.json)."""
    for case in golden()[:3]:
        n = len(case["prompt_ids"])
        resp = client.completions.create(model="tiny", prompt=case["prompt_ids"],
                                         max_tokens=len(case["greedy_ids"]), temperature=0,
                                         logprobs=5, extra_body={"ignore_eos": True})
        choice = resp.choices[0]
        assert choice.text == live.engine.tokenizer.decode(case["greedy_ids"])
        lp = choice.logprobs
        for j, (chosen, top) in enumerate(zip(lp.token_logprobs, lp.top_logprobs)):
            want = case["main_top5_logprobs"][n - 1 + j]
            assert chosen == pytest.approx(want[0], abs=FIXTURE_TOL)
            # keyed by token text: tokens that decode alike share an entry
            assert all(any(abs(v - w) <= FIXTURE_TOL for w in want) for v in top.values())
            assert max(top.values()) == pytest.approx(want[0], abs=FIXTURE_TOL)


def test_chat_logprobs_are_the_completions_ones_of_the_chat_prompt(client, live):
    """Chat log-probs over the rendered prompt equal completions' over the same ids (which
    the test above checks against the official values)."""
    import httpx

    messages = [{"role": "user", "content": PROMPT}]
    ids = httpx.post(f"{live.url}/tokenize", json={"messages": messages}).json()["tokens"]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=3)
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0,
                                      logprobs=3)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == plain.choices[0].logprobs.tokens
    for entry, chosen, top in zip(content, plain.choices[0].logprobs.token_logprobs,
                                  plain.choices[0].logprobs.top_logprobs):
        assert entry.logprob == pytest.approx(chosen, abs=1e-6)
        assert {t.token: t.logprob for t in entry.top_logprobs} == pytest.approx(top,
                                                                                  abs=1e-6)


def test_logprobs_zero_gives_the_sampled_token_at_each_position(client):
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=1,
                                     seed=3, logprobs=0)
    lp = resp.choices[0].logprobs
    assert len(lp.top_logprobs) == 4
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top == {token: pytest.approx(logprob)}


def test_echo_list_prompts_and_token_prompts(client, params):
    echoed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + _greedy_text(params, PROMPT, 3)
    listed = client.completions.create(model="tiny", prompt=[PROMPT, "t9 t10"], max_tokens=3,
                                       temperature=0)
    assert [c.index for c in listed.choices] == [0, 1]
    assert listed.choices[0].text == _greedy_text(params, PROMPT, 3)
    ids = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=3,
                                    temperature=0)
    assert ids.choices[0].text == listed.choices[0].text
    many = client.completions.create(model="tiny", prompt=[[5, 6, 7, 8], [9, 10]],
                                     max_tokens=3, temperature=0)
    assert [c.text for c in many.choices] == [c.text for c in listed.choices]


def test_chat_whole_and_streamed(client):
    messages = [{"role": "user", "content": "t5 t6"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                           temperature=0)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    joined = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert joined == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks].count("length") == 1
    capped = client.chat.completions.create(model="tiny", messages=messages,
                                            max_completion_tokens=2, temperature=0)
    assert capped.usage.completion_tokens == 2


def test_models_lists_the_served_model(client, live):
    [model] = client.models.list().data
    assert model.id == "tiny" and model.model_extra["max_model_len"] == 16384


def test_a_resent_prefix_is_reported_cached_in_usage_metrics_and_info(client, live):
    """The second request shares the first's 300 prompt tokens: 256 of them (two whole
    blocks, the token after each shared with MTP's lookahead) come from the cache."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.runtime.engine_support import random_prompt

    shared = random_prompt(300, 21)
    first = client.completions.create(model="tiny", prompt=shared + [5], max_tokens=2,
                                      temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model="tiny", prompt=shared + [9, 9], max_tokens=2,
                                      temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == 256
    streamed = list(client.completions.create(
        model="tiny", prompt=shared + [7], max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == 256
    families = {f.name: f.samples for f in
                text_string_to_metric_families(httpx.get(f"{live.url}/metrics").text)}
    queries = sum(s.value for s in families["vllm:prefix_cache_queries"])
    hits = sum(s.value for s in families["vllm:prefix_cache_hits"])
    assert hits >= 512 and queries >= 3 * 300
    info = httpx.get(f"{live.url}/server_info").json()["prefix_cache"]
    assert info["enabled"] and len(info["ranks"]) == 8
    assert sum(r["hits"] for r in info["ranks"]) == info["hits"] == hits
    assert max(r["cached_blocks"] for r in info["ranks"]) >= 2
    assert max(r["hit_rate"] for r in info["ranks"]) > 0
