"""cache_salt (vLLM's field): requests share prefix-cache entries only within one salt.
The block keys of each salt, the scheduler's hits (driven without a model), the engine's
`num_cached_tokens` on the reference checkpoint, the field's domain, and the salt's trip
to a separate engine core (the msgpack messages of runtime/process/core_messages.py)."""
from __future__ import annotations

import hashlib
import itertools

import msgspec
import pytest

from runtime.core.config import EngineConfig
from runtime.core.prefix_cache import Layout
from runtime.core.request import Request
from runtime.core.sampling_params import MAX_CACHE_SALT, InvalidParam, SamplingParams
from runtime.engine.intake import Add, Choice
from runtime.planning.admission import Admission
from runtime.process.core_messages import ToCore
from tests.model.support import FIXTURE, REF
from tests.runtime.engine_support import make_engine, random_prompt

BLOCK = 128
_ids = itertools.count()


def _request(tokens: list[int], salt: str | None = None, max_tokens: int = 1) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            cache_salt=salt)
    return Request(f"r{next(_ids)}", list(tokens), params, next(_ids))


def _layout(k: int = 1) -> Layout:
    return Layout.of(REF.pools.GROUPS, REF.architecture.CONFIG, BLOCK, k)


# -- keys ----------------------------------------------------------------------------------

def test_an_unsalted_requests_keys_are_those_of_its_tokens_alone():
    """Unsalted requests key as before salts existed: block 0 hashes its tokens only."""
    prompt = random_prompt(300, 1)
    packed = b"".join(t.to_bytes(8, "little", signed=True) for t in prompt[:BLOCK])
    assert _layout(0).keys(_request(prompt), 1) == \
        [hashlib.blake2b(packed, digest_size=16).digest()]


@pytest.mark.parametrize("k", [0, 1])
def test_each_salt_keys_every_block_apart(k):
    layout, prompt = _layout(k), random_prompt(700, 2)
    salts = [None, "alice", "bob", "alice ", "Alice", "a" * MAX_CACHE_SALT, "\u00e9", "e\u0301"]
    chains = [layout.keys(_request(prompt, salt), 5) for salt in salts]
    for a, b in itertools.combinations(range(len(salts)), 2):
        assert not set(chains[a]) & set(chains[b]), (salts[a], salts[b])
    assert layout.keys(_request(prompt, "alice"), 5) == chains[1]       # a salt's own keys
    assert layout.keys(_request(prompt[:600], "alice"), 4) == chains[1][:4]


# -- the scheduler, driven without a model ---------------------------------------------------

def _scheduler():
    admission = Admission.plan(EngineConfig(spec="reference", model=FIXTURE,
                                            num_speculative_tokens=1,
                                            prefix_affinity_threshold=64), REF)
    return admission.scheduler()


def _run(sched, request: Request) -> int:
    """Run the request to its end (the fake model samples token 7); its cached tokens."""
    sched.add(request)
    while sched.has_work():
        out = sched.schedule()
        results = {r: [7] for launch in out.decode for r in launch}
        results.update({ch.request: [7] for ch in out.prefill
                        if ch.terminal and not ch.request.output_ids})
        sched.commit(out, results)
    return request.num_cached_tokens


def test_a_prompt_hits_only_the_entries_its_own_salt_made():
    sched, prompt = _scheduler(), random_prompt(700, 3)
    assert _run(sched, _request(prompt, "alice")) == 0
    assert _run(sched, _request(prompt, "bob")) == 0          # alice's blocks: not bob's
    assert _run(sched, _request(prompt)) == 0                 # nor the unsalted requests'
    assert _run(sched, _request(prompt, "alice")) == 5 * BLOCK
    assert _run(sched, _request(prompt, "bob")) == 5 * BLOCK
    assert _run(sched, _request(prompt + [9])) == 5 * BLOCK   # unsalted share as before


def test_a_salted_requests_generated_tokens_are_cached_under_its_salt():
    """The output continues the salted chain: a next turn that resends prompt and
    output hits them under the same salt only."""
    sched, prompt = _scheduler(), random_prompt(200, 4)
    first = _request(prompt, "alice", max_tokens=100)
    _run(sched, first)
    turn = prompt + first.output_ids + [5, 6]
    assert _run(sched, _request(turn, "bob")) == 0
    assert _run(sched, _request(turn, "alice")) == 2 * BLOCK


# -- the engine ----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_engine_reports_cached_tokens_of_the_requests_own_salt_only():
    from tests.model.support import reference_params

    engine = make_engine(reference_params(), prefix_affinity_threshold=64)
    prompt = random_prompt(300, 5)

    def cached(salt: str | None) -> int:
        request = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=2,
                                                            cache_salt=salt))
        while engine.has_unfinished():
            engine.step()
        return request.num_cached_tokens

    assert [cached(s) for s in ("alice", "bob", None, "alice", None, "bob")] \
        == [0, 0, 0, 256, 256, 256]


# -- the field -----------------------------------------------------------------------------

@pytest.mark.parametrize("salt", ["", 5, b"alice", "x" * (MAX_CACHE_SALT + 1), "a\ud800"])
def test_a_cache_salt_must_be_a_non_empty_string(salt):
    with pytest.raises(InvalidParam) as err:
        SamplingParams(cache_salt=salt)
    assert err.value.param == "cache_salt"


# -- the engine core's messages ------------------------------------------------------------

@pytest.mark.parametrize("salt", [None, "alice", "\u00e9\U0001f600" * 100])
def test_the_salt_reaches_a_separate_engine_core(salt):
    """An Add as the core client encodes it and the core decodes it."""
    params = SamplingParams(temperature=0.5, max_tokens=3, cache_salt=salt)
    wire = msgspec.msgpack.Encoder().encode(Add([[5, 6, 7]], params, [Choice("r1", 0)]))
    got = msgspec.msgpack.Decoder(ToCore).decode(wire)
    assert got.params == params and got.params.cache_salt == salt
