"""cache_salt through HTTP: `cached_tokens` counts only the request's own salt's entries,
--require-cache-salt's 400, --cache-salt-from-api-key with two keys, and
--metrics-require-api-key. The flags' parsing, their checks at start and their way into
the server's state."""
from __future__ import annotations

import argparse
import dataclasses

import httpx
import pytest

from runtime.core.sampling_params import MAX_CACHE_SALT
from server.cache_salt import CacheSalts
from tests.runtime.engine_support import random_prompt
from tests.server.support import LiveServer

KEYS = ("key-one", "key-two")


def _auth(key: str = KEYS[0]) -> dict:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def live(params):
    """One server with two keys, its policies set per test (prompts differ per test, so
    no test sees another's cache entries)."""
    with LiveServer(params, api_key=KEYS) as server:
        yield server


@pytest.fixture
def policy(live):
    """Sets the server's salt and metrics policy for one test; restores it after."""
    before = (live.state.cache_salts, live.state.metrics_require_api_key)

    def set_policy(required=False, from_api_key=False, metrics_key=False):
        live.state.cache_salts = CacheSalts(required, from_api_key)
        live.state.metrics_require_api_key = metrics_key

    yield set_policy
    live.state.cache_salts, live.state.metrics_require_api_key = before


def _cached(live, prompt, salt=None, key=KEYS[0], chat=False) -> int:
    extra = {} if salt is None else {"cache_salt": salt}
    if chat:
        body = {"messages": [{"role": "user", "content": " ".join(f"t{t}" for t in prompt)}],
                "max_tokens": 2, **extra}
        path = "/v1/chat/completions"
    else:
        body, path = {"prompt": prompt, "max_tokens": 2, **extra}, "/v1/completions"
    answer = httpx.post(f"{live.url}{path}", json=body, headers=_auth(key), timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _refused(live, body: dict, path="/v1/completions", key=KEYS[0]) -> dict:
    answer = httpx.post(f"{live.url}{path}", json=body, headers=_auth(key), timeout=60)
    assert answer.status_code == 400, answer.text
    return answer.json()["error"]


@pytest.mark.slow
def test_cached_tokens_come_from_the_requests_own_salt_only(live, policy):
    policy()
    prompt = random_prompt(300, 401)
    assert _cached(live, prompt, "alice") == 0
    assert _cached(live, prompt, "bob") == 0           # alice's 256 tokens: a miss for bob
    assert _cached(live, prompt) == 0                   # and for the unsalted
    assert _cached(live, prompt, "alice") == 256
    assert _cached(live, prompt) == 256                 # unsalted requests share
    chat = random_prompt(300, 402)
    assert _cached(live, chat, "alice", chat=True) == 0
    assert _cached(live, chat, "bob", chat=True) == 0
    assert _cached(live, chat, "alice", chat=True) > 0


@pytest.mark.slow
@pytest.mark.parametrize(("salt", "path"), [
    ("", "/v1/completions"), ("", "/v1/chat/completions"), (5, "/v1/completions"),
    (["a"], "/v1/chat/completions"), ("x" * (MAX_CACHE_SALT + 1), "/v1/completions")])
def test_a_cache_salt_that_is_not_a_non_empty_string_is_a_400(live, policy, salt, path):
    policy()
    body = {"prompt": [5, 6], "messages": [{"role": "user", "content": "t5"}],
            "max_tokens": 1, "cache_salt": salt}
    assert _refused(live, body, path)["param"] == "cache_salt"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_require_cache_salt_refuses_a_request_without_one(live, policy, path):
    policy(required=True)
    body = {"prompt": [5, 6], "messages": [{"role": "user", "content": "t5"}],
            "max_tokens": 1}
    error = _refused(live, body, path)
    assert error["param"] == "cache_salt" and "requires a cache_salt" in error["message"]
    salted = httpx.post(f"{live.url}{path}", json={**body, "cache_salt": "s"}, headers=_auth(),
                        timeout=60)
    assert salted.status_code == 200


@pytest.mark.slow
def test_salts_from_api_keys_keep_each_keys_entries_its_own(live, policy):
    policy(from_api_key=True)
    prompt = random_prompt(300, 403)
    assert _cached(live, prompt, key=KEYS[0]) == 0
    assert _cached(live, prompt, key=KEYS[1]) == 0      # key one's entries: not key two's
    assert _cached(live, prompt, key=KEYS[0]) == 256
    assert _cached(live, prompt, key=KEYS[1]) == 256
    # a request's own salt is a subdomain of its key's: the same salt under another key
    # (or a salt equal to what the key alone derives) reaches nothing of the other's
    assert _cached(live, prompt, "team", key=KEYS[0]) == 0
    assert _cached(live, prompt, "team", key=KEYS[1]) == 0
    assert _cached(live, prompt, "team", key=KEYS[0]) == 256
    policy()                                            # the plain salts: none of those
    assert _cached(live, prompt, "team") == 0
    assert _cached(live, prompt) == 0
    denied = httpx.post(f"{live.url}/v1/completions", json={"prompt": [5]},
                        headers=_auth("key-three"))
    assert denied.status_code == 401


@pytest.mark.slow
def test_metrics_need_the_key_only_when_asked(live, policy):
    policy()
    assert httpx.get(f"{live.url}/metrics").status_code == 200         # vLLM's default
    policy(metrics_key=True)
    for headers in ({}, _auth("key-three"), {"authorization": KEYS[0]}):
        denied = httpx.get(f"{live.url}/metrics", headers=headers)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == 401
    for key in KEYS:
        scraped = httpx.get(f"{live.url}/metrics", headers=_auth(key))
        assert scraped.status_code == 200 and "vllm:num_requests_running" in scraped.text


# -- the flags -------------------------------------------------------------------------------

def _serve_args(*argv: str) -> argparse.Namespace:
    from server.cli import build_parser

    return build_parser().parse_args(["serve", *argv])


def test_the_flags_parse_into_the_servers_policy(monkeypatch):
    from server.cli.serve import api_keys, cache_salts

    for name in ("VLLM_API_KEY", "V4SERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    args = _serve_args("--api-key", "a", "b", "--require-cache-salt",
                       "--cache-salt-from-api-key", "--metrics-require-api-key")
    assert api_keys(args) == ("a", "b") and args.metrics_require_api_key
    assert cache_salts(args, api_keys(args)) == CacheSalts(True, True)
    plain = _serve_args()
    assert cache_salts(plain, ()) == CacheSalts() and not plain.metrics_require_api_key


@pytest.mark.parametrize("flag", ["--cache-salt-from-api-key", "--metrics-require-api-key"])
def test_a_flag_that_needs_an_api_key_is_refused_at_start_without_one(monkeypatch, flag):
    from server.cli.serve import api_keys, cache_salts

    for name in ("VLLM_API_KEY", "V4SERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    args = _serve_args(flag)
    with pytest.raises(SystemExit, match=f"{flag} needs --api-key"):
        cache_salts(args, api_keys(args))


def test_a_derived_salt_is_one_per_key_and_salt():
    salts = CacheSalts(from_api_key=True)
    derived = {salts.of(salt, f"Bearer {key}") for key in ("a", "b", "ab")
               for salt in (None, "x", "y", "\u00e9")}
    assert len(derived) == 12
    assert salts.of("x", "Bearer a") == salts.of("x", "Bearer a")
    assert dataclasses.replace(salts, from_api_key=False).of("x", "Bearer a") == "x"


def test_serve_hands_the_flags_to_the_server(monkeypatch):
    """make_server's state, with the engine core client built but never started."""
    from server.cli.serve import make_server
    from tests.conftest import REPO

    for name in ("VLLM_API_KEY", "V4SERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    args = _serve_args("--spec", "reference", "--model", str(REPO / "tests/fixtures/v4-tiny"),
                       "--api-key", *KEYS, "--require-cache-salt",
                       "--cache-salt-from-api-key", "--metrics-require-api-key")
    _, state = make_server(args)
    try:
        assert state.api_key == KEYS and state.metrics_require_api_key
        assert state.cache_salts == CacheSalts(required=True, from_api_key=True)
    finally:
        state.engine.shutdown()
    _, plain = make_server(_serve_args("--spec", "reference", "--model",
                                       str(REPO / "tests/fixtures/v4-tiny")))
    try:
        assert plain.api_key is None and not plain.metrics_require_api_key
        assert plain.cache_salts == CacheSalts()
    finally:
        plain.engine.shutdown()
