"""K = 2 and 3 MTP drafts (the checkpoint's one MTP layer applied recursively) and the
adaptive choice of K per step, end to end on the embedded model, whose drafts are kept
about 60% of the time at every position: greedy output is the K=0 output on both
backends, with chunked prefill, preemption and prefix-cache hits in the same run, and
every block and slot comes back."""
from __future__ import annotations

import random

import pytest

import generated
from runtime.core.config import EngineConfig
from runtime.core.prefix_cache import Layout
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculation import AdaptiveSpeculation
from runtime.engine.engine import Engine
from runtime.planning import capacity
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params
from tests.conftest import REPO
from tests.model.test_embedded import CODE
from tests.runtime.engine_support import assert_all_free

pytestmark = pytest.mark.slow

MODEL = REPO / "models" / "tiny"
TINY = generated.load("tiny")
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def params():
    return load_params(MODEL, TINY)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Sixteen prompts, twelve of them behind a shared 260-token prefix (two blocks and
    some: prefix-cache hits), all longer than one 128-token chunk."""
    tokenizer = Tokenizer(MODEL)
    code = tokenizer.encode(CODE * 6)
    assert len(code) > 800
    suffixes = [tokenizer.encode(f"\n# task {i}: write a function that returns {i * 7}\n")
                for i in range(12)]
    alone = [code[260 + 130 * i: 460 + 130 * i] for i in range(4)]
    return [code[:260] + s for s in suffixes] + alone


def _engine(params, k: int, backend: str, policy: str = "fixed", **config) -> Engine:
    config = EngineConfig(spec="tiny", model=MODEL, num_speculative_tokens=k, backend=backend,
                          speculative_policy=policy, **config)
    return Engine(config, TINY, params, Tokenizer(MODEL))


@pytest.fixture(scope="module")
def expected(params, prompts) -> list[list[int]]:
    """Plain decode, whole prompts, no prefix cache."""
    engine = _engine(params, 0, "compiled-eager", enable_prefix_caching=False)
    return [o.output_ids for o in engine.generate(prompts, GREEDY)]


class Switching(AdaptiveSpeculation):
    """Every step a K drawn at random, and at K=0 the plain kernel or its twin that keeps
    the MTP slots: the MTP state must follow every switch."""

    def __init__(self, max_k: int, seed: int):
        super().__init__(max_k)
        self.rng = random.Random(seed)

    def choose(self, rows, left=None) -> int:
        k = self.rng.randrange(len(self.ks))
        self.keep_slots = self.rng.random() < 0.5
        self.chosen[k] = self.chosen.get(k, 0) + 1
        return k


def _tight(k: int, running: int) -> int:
    """Pool bytes per rank for 512 tokens: less than two of the prompts here and their
    outputs."""
    layout = Layout.of(TINY.pools.GROUPS, TINY.architecture.CONFIG, TINY.contract.BLOCK_SIZE, k)
    return capacity.bytes_for(TINY.pools.GROUPS, running, 512, layout.copies)


@pytest.mark.parametrize("backend", ["torch", "compiled-eager"])
@pytest.mark.parametrize("policy, k", [("fixed", 2), ("fixed", 3), ("adaptive", 3),
                                       ("switching", 3)])
def test_k_drafts_keep_greedy_output_through_chunks_preemption_and_hits(
        params, prompts, expected, backend, policy, k):
    adaptive = policy != "fixed"
    engine = _engine(params, k, backend, "adaptive" if adaptive else "fixed",
                     long_prefill_token_threshold=128, max_model_len=512,
                     kv_cache_memory=_tight(k, 16 if adaptive else 8))
    if policy == "switching":
        engine.scheduler.speculation = Switching(k, seed=len(backend))
    got = [o.output_ids for o in engine.generate(prompts, GREEDY)]
    assert got == expected
    stats = engine.stats
    assert engine.scheduler.num_preemptions > 0
    assert engine.prefix_cache_info()["hits"] > 0
    assert engine.dispatches["prefill_main"] >= 3      # a 272-token prompt in 128-token chunks
    if policy == "fixed":
        assert engine.dispatches[f"decode_b4s{k + 1}"] == sum(stats.decode_steps_by_k.values())
        assert all(stats.accepted_per_position)                  # every position kept some
    else:
        assert sorted(stats.decode_steps_by_k) == list(range(k + 1))
    if policy == "switching":               # K=0 ran plain and the twin, lossless after both
        assert 0 < stats.twin_steps < stats.decode_steps_by_k[0]
        assert engine.dispatches["decode_b8s1"] and engine.dispatches["decode_b8s1_mtp"]
    assert stats.accepted_tokens == sum(stats.accepted_per_position) > 0
    assert_all_free(engine)


class Recording(Switching):
    """Switching, and each step's report: K, rows, (request's acceptance, drafts kept)."""

    DECAY = 1.0                                 # the common counts are plain counts

    def __init__(self, max_k: int, seed: int):
        super().__init__(max_k, seed)
        self.steps: list[tuple[int, int, list]] = []
        self.twins: list[bool] = []                 # per step: K=0 kept the MTP slots
        self.events: list[str] = []     # per report: prefilled, decoded (timed or not)

    def observe(self, k, rows, seconds, drafts, twin=False) -> None:
        self.steps.append((k, rows, [(id(a), kept) for a, kept in drafts]))
        self.twins.append(twin)
        self.events.append("decoded" if seconds is not None else "decoded, untimed")
        super().observe(k, rows, seconds, drafts, twin)

    def prefilled(self) -> None:
        self.events.append("prefilled")
        super().prefilled()


def test_the_policy_counts_every_fused_row_not_behind(params, prompts):
    """The engine reports every row of a K=0 step (none drafted, none kept) and which
    K=0 kernel ran, and the policy counts every fused row's drafts but those of a row
    whose step before was a plain one (its slot caught up, its streams older): after the
    twin, that keeps the slots, it counts them."""
    engine = _engine(params, 3, "compiled-eager", "adaptive")
    policy = engine.scheduler.speculation = Recording(3, seed=7)
    engine.generate(prompts[:4], GREEDY)
    behind, counted = set(), 0
    for (k, rows, drafts), twin in zip(policy.steps, policy.twins):
        assert len(drafts) == rows
        assert k or all(kept == 0 for _, kept in drafts)
        ids = {request for request, _ in drafts}
        counted += len(ids - behind) if k else 0
        behind = (behind | ids) if not k and not twin else behind - ids
    assert {k for k, _, _ in policy.steps} == {0, 1, 2, 3}
    assert set(policy.twins) == {True, False}
    assert 0 < policy.acceptance.reached[0] == counted
    # a step that prefilled says so before its decode, which is not timed
    events = policy.events
    assert events[0] == "prefilled" and "decoded" in events
    assert all(events[i - 1] == "prefilled"
               for i, event in enumerate(events) if event == "decoded, untimed")


class Scheduled(Recording):
    """K=0 for the first `plain` decode steps, then `k` every step."""

    def __init__(self, max_k: int, plain: int, k: int):
        super().__init__(max_k, seed=0)
        self.plain, self.k_after = plain, k

    def choose(self, rows, left=None) -> int:
        self.plain -= 1
        return 0 if self.plain >= 0 else self.k_after


@pytest.mark.parametrize("backend", ["torch", "compiled-eager"])
def test_plain_steps_keep_the_mtp_window_whole(params, prompts, backend):
    """Forty K=0 steps, then K=2: each step drafts and keeps what a request prefilled
    with the prompt and those forty tokens does at K=2 from its first step. The K=0
    steps wrote the MTP layer's window and moved the slot on as fused ones do (with the
    window left with a hole over those forty positions, the drafts after them differ)."""
    plain, fused = 40, 24
    first = _engine(params, 3, backend, "adaptive", enable_prefix_caching=False)
    scheduled = first.scheduler.speculation = Scheduled(3, plain, 2)
    prompt = prompts[12]
    params_long = SamplingParams(temperature=0, max_tokens=plain + 3 * fused + 4,
                                 ignore_eos=True)          # room for `fused` whole steps
    out = first.generate([prompt], params_long)[0].output_ids
    second = _engine(params, 3, backend, "adaptive", enable_prefix_caching=False)
    again = second.scheduler.speculation = Scheduled(3, 0, 2)
    second.generate([prompt + out[:plain]], params_long)
    after = [kept for k, _, drafts in scheduled.steps[plain:] for _, kept in drafts]
    fresh = [kept for k, _, drafts in again.steps for _, kept in drafts]
    assert [k for k, _, _ in scheduled.steps[:plain + 1]] == [0] * plain + [2]
    assert len(after) > fused and after[:fused] == fresh[:fused]
    assert 0 < sum(after[:fused]) < 2 * fused          # some drafts kept, not all
    assert_all_free(first)
    assert_all_free(second)


def test_a_switch_of_k_never_recomputes(params, prompts, expected):
    """The same prefill launches as a plain run: a step that changes K reads the MTP
    state the step before left, whatever that step's K."""
    plain = _engine(params, 0, "compiled-eager")
    plain.generate(prompts[:4], GREEDY)
    engine = _engine(params, 3, "compiled-eager", "adaptive")
    engine.scheduler.speculation = Switching(3, seed=5)
    assert [o.output_ids for o in engine.generate(prompts[:4], GREEDY)] == expected[:4]
    assert engine.dispatches["prefill_main"] == plain.dispatches["prefill_main"]
    assert engine.dispatches["prefill_mtp"] == engine.dispatches["prefill_main"]
