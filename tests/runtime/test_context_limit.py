"""Speculation at the context limit, and a launch that fails.

A decode row of a request of n tokens writes positions n - 1 .. n - 1 + K: the scheduler
caps a step's K at max_model_len - n for every row, so no context passes max_model_len
(the kernels' last context bucket), and reserves blocks for no more. Requests that run to
the limit at every K, fixed and adaptive, with whole and chunked prompts, end with
"length" at exactly max_model_len tokens, with K=0's greedy output, and the engine serves
on. A launch that raises ends the requests it carries with its error; the others, and
the requests after, are served.

The scheduler's half runs without a model (fast); the engine's on the embedded model,
whose drafts are kept about 60% of the time, with the largest context bucket lowered to
max_model_len as a spec whose max_model_len is its own limit has it.
"""
from __future__ import annotations

import pytest

import generated
from contract.abi import ABIError, KernelABI
from runtime.core.config import EngineConfig
from runtime.core.request import Status
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import refusal
from runtime.core.speculation import AdaptiveSpeculation, step_ks
from runtime.device.launcher import Launcher
from runtime.engine.engine import Engine
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params
from tests.conftest import REPO
from tests.model.test_embedded import CODE
from tests.runtime.engine_support import assert_all_free
from tests.runtime.test_scheduler import FORMULAS, TOKEN, add, check_books, make

L = 64                 # max_model_len of the scheduler's tests


def _accepting(out) -> dict:
    """What a model that keeps every draft returns: K + 1 tokens a decode row."""
    rows = {r: [TOKEN] * (out.k + 1) for launch in out.decode for r in launch}
    rows.update({ch.request: [TOKEN] for ch in out.prefill
                 if ch.terminal and not ch.request.output_ids})
    return rows


def _run_to_the_limit(s, steps=200) -> list[tuple[int, list[int]]]:
    """Step until done; check every decode row's positions and blocks; each decode
    step's (K, its rows' tokens)."""
    seen = []
    for _ in range(steps):
        if not s.has_work():
            return seen
        out = s.schedule()
        assert not out.empty, "no progress"
        rows = [r for launch in out.decode for r in launch]
        for r in rows:
            assert r.num_tokens - 1 + out.k <= s.config.max_model_len - 1
            for group, formula in FORMULAS.items():        # its K's blocks are reserved
                assert len(r.blocks[group]) >= formula(r.num_tokens + out.k)
        if rows:
            seen.append((out.k, [r.num_tokens for r in rows]))
        s.commit(out, _accepting(out))
        if rows:              # every draft kept; a step costs 1 + K/4 of a plain one
            s.speculation.observe(out.k, len(rows), 1e-3 * (1 + out.k / 4),
                                  [(r.acceptance, out.k) for r in rows])
        check_books(s)
    raise AssertionError("still working")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_step_k_is_capped_at_the_room_left_by_every_row(k):
    s = make(ranks=1, k=k, slots=4, max_model_len=L, effective_extent=64,
             max_num_batched_tokens=64)
    reqs = add(s, L - 1, L - 2, L - 3, L - 5, L - 9, L - 20, max_tokens=1000)
    seen = _run_to_the_limit(s)
    assert all((r.finish_reason, r.num_tokens) == ("length", L) for r in reqs)
    assert reqs[0].output_ids == [TOKEN]            # done by its first token, no decode
    for step_k, lengths in seen:
        assert step_k == min([k] + [L - n for n in lengths])
    assert {step_k for step_k, _ in seen} == set(range(1, k + 1))


def test_a_row_at_the_limit_never_needs_blocks_beyond_max_model_len():
    """A rank holds exactly one request of max_model_len: the last steps reserve no
    more (reserving tail + K positions there preempted the request itself, again and
    again)."""
    s = make(ranks=1, k=3, kv=L // 4, ring=2, slots=1, max_model_len=L, effective_extent=64,
             max_num_batched_tokens=64)
    (a,) = add(s, L - 11, max_tokens=1000)        # 54, 58, 62 tokens: 62 + 3 > 64
    _run_to_the_limit(s)
    assert (a.finish_reason, a.num_tokens, a.num_preemptions) == ("length", L, 0)


def test_refusal_counts_the_first_step_up_to_max_model_len_only():
    """The prompt and its first decode step need at most max_model_len positions."""
    config = make(ranks=1, k=3, max_model_len=L).config
    capacity = {"kv": L // 4, "ring": 2}
    assert refusal(L - 1, config, FORMULAS, capacity) is None
    assert refusal(L - 8, config, FORMULAS, capacity) is None
    small = {"kv": L // 4 - 1, "ring": 2}
    assert "kv blocks" in refusal(L - 1, config, FORMULAS, small)


def test_a_cap_between_served_ks_falls_to_the_next_served():
    """A spec with layouts for K = 0 and 3 only: within 3 of the limit, plain steps."""
    s = make(ranks=1, k=3, slots=2, max_model_len=L, batches=(2, 0, 0, 2))
    (a,) = add(s, L - 6, max_tokens=1000)
    seen = _run_to_the_limit(s)
    assert [k for k, _ in seen] == [3, 0]          # 59 tokens -> 63 -> (cap 1: K=0) 64
    assert a.num_tokens == L


def test_step_ks_are_the_caps_a_fixed_policy_may_need():
    assert step_ks("fixed", 0, {0, 1, 2, 3}) == (0,)
    assert step_ks("fixed", 1, {0, 1, 2, 3}) == (1,)
    assert step_ks("fixed", 3, {0, 1, 2, 3}) == (1, 2, 3)
    assert step_ks("fixed", 3, {0, 3}) == (0, 3)
    assert step_ks("adaptive", 2, {0, 1, 2, 3}) == (0, 1, 2)


def test_the_adaptive_policy_is_capped_too():
    s = make(ranks=1, k=3, slots=4, max_model_len=L, effective_extent=64,
             max_num_batched_tokens=64)
    s.speculation = AdaptiveSpeculation(3)
    reqs = add(s, L - 30, L - 31, L - 33, L - 36, max_tokens=1000)
    seen = _run_to_the_limit(s)
    assert all((r.finish_reason, r.num_tokens) == ("length", L) for r in reqs)
    assert all(k <= min(L - n for n in lengths) for k, lengths in seen)
    assert max(k for k, _ in seen) == 3                 # it did choose 3 drafts


# -- end to end --------------------------------------------------------------------

MODEL = REPO / "models" / "tiny"
TINY = generated.load("tiny")
MAX_LEN = 96
UNTIL_THE_END = SamplingParams(temperature=0, max_tokens=MAX_LEN, ignore_eos=True)


@pytest.fixture(scope="module")
def params():
    return load_params(MODEL, TINY)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(MODEL)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Prompts that end 1, 2, 3, 5 and 10 tokens short of the limit: their last steps
    have room for 0 to 3 drafts and more, beside rows with more room."""
    code = tokenizer.encode(CODE * 6)
    return [code[7 * i: 7 * i + MAX_LEN - short] for i, short in enumerate((1, 2, 3, 5, 10))]


@pytest.fixture
def last_bucket(monkeypatch):
    """The kernels' largest context bucket is max_model_len (the spec's own limit)."""
    real = KernelABI.context_bucket

    def bucket(self, length):
        if length > MAX_LEN:
            raise ABIError(f"{self.name}: a context of {length} positions exceeds the "
                           f"largest bucket {MAX_LEN}")
        return real(self, length)

    monkeypatch.setattr(KernelABI, "context_bucket", bucket)


def _engine(params, tokenizer, k=1, policy="fixed", **config) -> Engine:
    config.setdefault("max_model_len", MAX_LEN)
    config = EngineConfig(spec="tiny", model=MODEL, num_speculative_tokens=k,
                          speculative_policy=policy, backend="compiled-eager", **config)
    return Engine(config, TINY, params, tokenizer)


@pytest.fixture(scope="module")
def plain(params, tokenizer, prompts) -> list[list[int]]:
    """K=0 greedy outputs, whole prompts."""
    engine = _engine(params, tokenizer, k=0)
    return [o.output_ids for o in engine.generate(prompts, UNTIL_THE_END)]


def _serves_another(engine: Engine, prompt: list[int]) -> None:
    [out] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=4))
    assert (out.finish_reason, len(out.output_ids)) == ("length", 4)


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("policy, k", [("fixed", 0), ("fixed", 1), ("fixed", 2),
                                       ("fixed", 3), ("adaptive", 3)])
def test_requests_run_to_the_limit_at_every_k(params, tokenizer, prompts, plain, last_bucket,
                                              policy, k, chunked):
    engine = _engine(params, tokenizer, k, policy,
                     long_prefill_token_threshold=64 if chunked else None)
    outputs = engine.generate(prompts, UNTIL_THE_END)
    assert all(o.finish_reason == "length" and not o.error for o in outputs)
    assert [len(p) + len(o.output_ids) for p, o in zip(prompts, outputs)] == \
        [MAX_LEN] * len(prompts)
    assert [o.output_ids for o in outputs] == plain
    if policy == "fixed" and k:
        steps = engine.stats.decode_steps_by_k
        assert set(steps) == set(range(1, k + 1)), steps        # capped near the end
        assert engine.stats.accepted_tokens > 0
    if chunked:
        assert engine.dispatches["prefill_main"] >= 2          # 64 tokens, then the rest
    _serves_another(engine, prompts[0][:40])
    assert_all_free(engine)


# -- a launch that fails -----------------------------------------------------------

@pytest.fixture
def failing_launch(monkeypatch, prompts):
    """Launches of the kinds in the returned set raise: a main prefill whose tokens hold
    MARK (a token id no prompt here holds) while "prefill" is in it, a decode launch with
    rows while "decode" is."""
    kinds: set[str] = set()
    real = Launcher.marshal

    def marshal(self, live=None, **given):
        kind = self.kernel.kind
        if kind == "prefill_main" and "prefill" in kinds and (given["token_ids"] == MARK).any():
            raise ABIError("injected prefill fault")
        if kind.startswith("decode") and "decode" in kinds and live is not None and len(live):
            raise ABIError("injected decode fault")
        return real(self, live, **given)

    assert not any(MARK in p for p in prompts)
    monkeypatch.setattr(Launcher, "marshal", marshal)
    return kinds


MARK = 3


def _step_until(engine: Engine, done) -> dict:
    final = {}
    while engine.has_unfinished() and not done(final):
        final.update({o.request_id: o for o in engine.step() if o.finished})
    return final


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_a_failing_prefill_launch_ends_only_its_requests(params, tokenizer, prompts,
                                                         failing_launch, k):
    """The marked prompt's first block (128 tokens) is saved for the prefix cache in
    the launch that fails: no entry is made of it, so the same prompt computes again."""
    base = prompts[4] + prompts[3]
    healthy, marked = prompts[3][:60], base[:50] + [MARK] + base[50:170]
    twelve = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    clean = [o.output_ids for o in _engine(params, tokenizer, k=0, max_model_len=None)
             .generate([healthy, marked], twelve)]
    engine = _engine(params, tokenizer, k, max_model_len=None)
    failing_launch.add("prefill")
    a = engine.add_request(healthy, twelve).request_id
    engine.step()
    engine.step()                                       # a decodes while b prefills
    b = engine.add_request(marked, twelve).request_id
    final = _step_until(engine, lambda final: False)
    assert (final[b].finish_reason, final[b].error) == ("error", "ABIError: injected "
                                                                  "prefill fault")
    assert (final[a].finish_reason, final[a].output_ids) == ("length", clean[0])
    failing_launch.clear()
    [again] = engine.generate([marked], twelve)
    assert again.output_ids == clean[1] and again.num_cached_tokens == 0
    assert_all_free(engine)


@pytest.mark.slow
def test_a_failing_decode_launch_ends_its_rows_and_the_engine_serves_on(params, tokenizer,
                                                                       prompts,
                                                                       failing_launch):
    first, later = prompts[3][:60], prompts[4][:80]
    twelve = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    clean = [o.output_ids for o in _engine(params, tokenizer, k=0).generate([later], twelve)]
    engine = _engine(params, tokenizer, k=1)
    a = engine.add_request(first, twelve)
    engine.step()                                       # a's prompt, then it decodes
    failing_launch.add("decode")
    b = engine.add_request(later, twelve)
    outputs = {o.request_id: o for o in engine.step()}  # a's decode fails, b prefills
    failing_launch.clear()
    assert outputs[a.request_id].finish_reason == "error"
    assert "injected decode fault" in outputs[a.request_id].error
    assert a.status is Status.FINISHED and b.status is Status.RUNNING
    final = _step_until(engine, lambda final: b.request_id in final)
    assert (final[b.request_id].finish_reason, final[b.request_id].output_ids) == \
        ("length", clean[0])
    _serves_another(engine, first)
    assert_all_free(engine)
