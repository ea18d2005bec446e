"""Property tests of sampling over the whole domain SamplingParams admits, edges included:

    the sampler     launches of several rows with random params, logits and masks, run
                    through SamplingState and batch_sampler as the model runner runs
                    them: nothing raises, every row is sound, every token is allowed by
                    its mask and in the support of the oracle (tests/runtime/
                    sampling_oracle.py) within float32's rounding
    an engine       a hostile request beside greedy ones: it finishes (normally or with
                    its own error), the others' outputs do not change, nothing leaks

Hypothesis runs derandomized: the examples are the same on every run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.sampling import batch_sampler
from runtime.sampling.sampling_state import SamplingState
from tests.model.support import reference_params
from tests.runtime import sampling_oracle as oracle
from tests.runtime.engine_support import assert_all_free, make_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
F64_MAX = float(np.finfo(np.float64).max)
VOCABS = (1, 2, 3, 8, 33)
FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- strategies -------------------------------------------------------------------------

def _floats(low: float, high: float, edges: list[float], **kwargs):
    return st.one_of(st.sampled_from(edges), st.floats(low, high, **kwargs))


def sampling_params(vocab: int, max_logprobs: int = 40):
    """Any SamplingParams the schema admits (log-probs up to max_logprobs), edges drawn
    often."""
    return st.builds(
        SamplingParams,
        max_tokens=st.integers(1, 8),
        temperature=st.one_of(
            _floats(0.0, F64_MAX, [0.0, 5e-324, 1e-300, 1e-6, 9.99999e-6, 1e-5, 1.00001e-5,
                                   1.0, 1e30, F32_MAX, 1e308, F64_MAX]),
            st.floats(0.05, 5.0)),
        top_k=st.one_of(st.sampled_from([-1, 0, 1, vocab - 1, vocab, vocab + 1, 10**9,
                                         10**18, 2**63 - 1]), st.integers(-1, vocab + 2)),
        top_p=_floats(0.0, 1.0, [5e-324, 1e-300, 1e-10, 0.5, 1.0], exclude_min=True),
        min_p=_floats(0.0, 1.0, [0.0, 5e-324, 1e-300, 0.5, 1.0]),
        presence_penalty=_floats(-2.0, 2.0, [-2.0, 0.0, 2.0]),
        frequency_penalty=_floats(-2.0, 2.0, [-2.0, 0.0, 2.0]),
        repetition_penalty=_floats(0.0, F64_MAX, [5e-324, 1e-300, 1e-30, 0.5, 1.0, 2.0, 1e30,
                                                  F32_MAX, 1e308, F64_MAX], exclude_min=True),
        seed=st.one_of(st.none(), st.sampled_from([-2**63, -1, 0, 2**63 - 1]),
                       st.integers(-2**63, 2**63 - 1)),
        logit_bias=st.lists(st.tuples(st.integers(0, vocab - 1),
                                      _floats(-100.0, 100.0, [-100.0, 0.0, 100.0])),
                            max_size=4, unique_by=lambda pair: pair[0]).map(tuple),
        logprobs=st.one_of(st.none(), st.integers(0, max_logprobs)))


EDGE_LOGITS = [0.0, -0.0, 1e-30, 1e30, -1e30, F32_MAX, -F32_MAX]


@dataclass
class Row:
    params: SamplingParams
    prompt: list[int]
    output: list[int]
    seed: int
    logits: np.ndarray          # [P, V] float32: P = 1 (sample) or K+1 (verify: tail, drafts)
    allowed: np.ndarray         # [P, V] bool, something allowed at each position
    drafts: list[int]           # P - 1 of them


@st.composite
def logit_rows(draw, vocab: int) -> np.ndarray:
    """Finite float32 logits [V] of any scale, sometimes tied, some set to edge values
    (drawn from a seed: drawing every float costs hypothesis too much time)."""
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-6, 1.0, 5.0, 30.0, 1e30, F32_MAX / 8]))
    logits = gen.normal(size=vocab) * scale
    if draw(st.booleans()):
        logits = np.round(logits / scale) * scale        # ties
    for token, value in draw(st.lists(st.tuples(st.integers(0, vocab - 1),
                                                st.sampled_from(EDGE_LOGITS)), max_size=3)):
        logits[token] = value
    return np.clip(logits, -F32_MAX, F32_MAX).astype(np.float32)


PARAMS = {vocab: sampling_params(vocab) for vocab in VOCABS}       # built once: fast draws
TOKENS = {vocab: st.lists(st.integers(0, vocab - 1), max_size=5) for vocab in VOCABS}


@st.composite
def rows(draw, vocab: int, positions: int) -> Row:
    params, tokens = draw(PARAMS[vocab]), TOKENS[vocab]
    logits = np.stack([draw(logit_rows(vocab)) for _ in range(positions)])
    allowed = np.ones((positions, vocab), bool)
    if draw(st.booleans()):
        for p in range(positions):
            bits = draw(st.integers(0, 2**vocab - 1))
            allowed[p] = [(bits >> t) & 1 for t in range(vocab)]
            allowed[p, draw(st.integers(0, vocab - 1))] = True
    seed = params.seed if params.seed is not None else draw(st.integers(-2**63, 2**63 - 1))
    drafts = draw(st.lists(st.integers(0, vocab - 1), min_size=positions - 1,
                           max_size=positions - 1))
    return Row(params, draw(tokens), draw(tokens), seed, logits, allowed, drafts)


@st.composite
def launches(draw, positions: int) -> tuple[int, list[Row]]:
    vocab = draw(st.sampled_from(VOCABS))
    return vocab, [draw(rows(vocab, positions)) for _ in range(draw(st.integers(1, 4)))]


# -- the sampler ------------------------------------------------------------------------


def _pack(allowed: np.ndarray) -> torch.Tensor:
    """allowed [..., V] bool -> the grammar's int32 words [..., ceil(V / 32)]."""
    vocab = allowed.shape[-1]
    padded = np.zeros((*allowed.shape[:-1], (vocab + 31) // 32 * 32), bool)
    padded[..., :vocab] = allowed
    return torch.from_numpy(np.packbits(padded, axis=-1, bitorder="little")
                            .view(np.int32).copy())


def _launch(vocab: int, launch: list[Row]):
    """(rows, counts, seen, allowed [N, P, V]) as the model runner builds them."""
    state = SamplingState(len(launch), vocab, CPU)
    for slot, row in enumerate(launch):
        state.admit(slot, row.prompt, row.output, row.params, row.seed)
    rows_ = state.rows(np.arange(len(launch)), np.array([len(r.output) for r in launch]))
    allowed = batch_sampler.unpack_mask(_pack(np.stack([r.allowed for r in launch])), vocab)
    return rows_, *state.penalties(rows_), allowed


def _tolerance(row: Row, logits: np.ndarray, output: list[int], adjusted) -> np.ndarray:
    """How far float32 arithmetic may take each adjusted logit from the oracle's [V]:

    logit + bias    rounded (or flushed to 0) in float32, the error scaled by the
                    repetition penalty whichever way it goes (a sum rounded across 0
                    takes the other way: the bound holds too);
    repetition      beyond float32's range the sampler holds the nearest float32
                    penalty: a seen token's logit is then anywhere in range;
    the rest        relative rounding, and 2.5e-7 of the distance to the row's maximum
                    (the temperature divides the logits minus their maximum in float32).
    """
    p, vocab = row.params, logits.shape[0]
    exact_bias, bias32 = np.zeros(vocab), np.zeros(vocab, np.float32)
    for token, value in p.logit_bias:
        exact_bias[token] += value
        bias32[token] += np.float32(value)
    exact_sum = logits.astype(np.float64) + exact_bias
    error = (np.abs((logits + bias32).astype(np.float64) - exact_sum)
             + 1e-7 * np.abs(exact_sum) + 1.5e-45)
    seen = np.zeros(vocab, bool)
    seen[row.prompt + output] = True
    counts = np.bincount(np.array(output, int), minlength=vocab)
    rep = p.repetition_penalty
    with np.errstate(over="ignore"):
        error = np.where(seen, error * max(rep, 1 / rep), error)
    if not F32_TINY <= rep <= F32_MAX:
        error = np.where(seen, np.inf, error)
    finite = np.isfinite(adjusted)
    level = np.where(finite, np.abs(adjusted), 0)
    spread = np.where(finite, adjusted.max() - adjusted, 0)
    return error + 1e-6 * (abs(p.frequency_penalty) * counts + abs(p.presence_penalty)
                           + level) + 2.5e-7 * spread + 1e-30


def _check_row(row: Row, at: int, output: list[int], got_adjusted, token: int) -> None:
    """The production row's adjusted logits are the oracle's within float32 rounding, and
    `token` is allowed and in the oracle's support."""
    logits, allowed = row.logits[at], row.allowed[at]
    want = oracle.adjusted_logits(logits.astype(np.float64), row.params, row.prompt, output,
                                  allowed)
    got = got_adjusted.double().numpy()
    tol = _tolerance(row, logits, output, want)
    assert (np.isinf(got) == ~allowed).all() and (np.isinf(want) == ~allowed).all()
    assert (np.abs(got[allowed] - want[allowed]) <= tol[allowed]).all(), (got, want, tol)
    assert 0 <= token < logits.shape[0] and allowed[token]
    assert oracle.possible(want, row.params, tol, token), (token, want, tol)


@FAST
@given(launches(positions=1))
def test_any_launch_samples_soundly_within_the_oracles_support(launch):
    vocab, launch = launch
    rows_, counts, seen, allowed = _launch(vocab, launch)
    logits = torch.from_numpy(np.stack([r.logits[0] for r in launch]))
    tokens, sound = batch_sampler.sample(logits, rows_, counts, seen, allowed[:, 0])
    adjusted = batch_sampler.adjusted(logits, rows_, counts, seen, allowed[:, 0])
    assert bool(sound.all())
    for i, row in enumerate(launch):
        _check_row(row, 0, row.output, adjusted[i], int(tokens[i]))


@FAST
@given(st.sampled_from([2, 3]).flatmap(lambda positions: launches(positions)))
def test_any_launch_verifies_soundly_within_the_oracles_support(launch):
    """K = 1 or 2 drafts: every committed position (kept drafts, then the target or the
    bonus) is allowed and in the support of its position's distribution, the drafts
    before it counted as output."""
    vocab, launch = launch
    rows_, counts, seen, allowed = _launch(vocab, launch)
    logits = torch.from_numpy(np.stack([r.logits for r in launch]))
    drafts = torch.tensor([r.drafts for r in launch])
    k = drafts.shape[1]
    tokens, accepted, sound = batch_sampler.verify(logits, drafts, rows_, counts, seen,
                                                   allowed)
    assert bool(sound.all()) and bool(((accepted >= 0) & (accepted <= k)).all())
    for j in range(k + 1):
        adjusted = batch_sampler.adjusted(logits[:, j], rows_, counts, seen, allowed[:, j])
        for i, row in enumerate(launch):
            a = int(accepted[i])
            if j > a:
                continue
            if j < k:
                assert (int(tokens[i, j]) == row.drafts[j]) == (j < a)
            _check_row(row, j, [*row.output, *row.drafts[:j]], adjusted[i], int(tokens[i, j]))
        if counts is not None and j < k:
            one = torch.nn.functional.one_hot(drafts[:, j], vocab).to(counts.dtype)
            counts, seen = counts + one, seen | one.bool()


# -- an engine --------------------------------------------------------------------------

OTHERS = [[5, 17, 99, 3], [250, 7, 7, 7, 41, 300], [1, 2]]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    return make_engine(reference_params())


@pytest.fixture(scope="module")
def clean(engine):
    """The others' greedy outputs, each alone."""
    return [engine.generate([p], GREEDY)[0].output_ids for p in OTHERS]


def _run(engine, hostile: list[tuple[list[int], SamplingParams]]):
    """The others and the hostile requests (those the engine takes) to the end:
    (the others' outputs, the hostile requests' final outputs)."""
    ids = [engine.add_request(p, GREEDY).request_id for p in OTHERS[:2]]
    taken = {}
    for prompt, params in hostile:
        try:
            taken[engine.add_request(prompt, params).request_id] = params
        except ValueError:          # what the engine refuses (InvalidParam is one)
            pass
    ids.append(engine.add_request(OTHERS[2], GREEDY).request_id)
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    for request_id, params in taken.items():
        out = final[request_id]
        assert out.finish_reason in ("stop", "length"), out      # valid params run
        assert len(out.output_ids) <= params.max_tokens
        assert out.finish_reason != "length" or len(out.output_ids) == params.max_tokens
    assert_all_free(engine)
    return [final[i].output_ids for i in ids], [final[i] for i in taken]


NAN, INF = float("nan"), float("inf")
# values out of a field's domain (InvalidParam), or that only the engine refuses
REFUSED = {
    "temperature": [-1.0, -5e-324, NAN, INF, -INF, None, "1"],
    "top_k": [-2, -10**30, 2**63, 10**30, 1.5, None],
    "top_p": [0.0, -0.0, 1.0000001, NAN, INF],
    "min_p": [-0.1, 1.0000001, NAN],
    "presence_penalty": [2.5, -INF, NAN],
    "frequency_penalty": [-2.01, INF],
    "repetition_penalty": [0.0, -1.0, INF, NAN],
    "seed": [2**63, -2**63 - 1, 1.0, "7"],
    "logit_bias": [((512, 1.0),), ((-1, 1.0),), ((3, 100.5),), ((3, NAN),)],
    "logprobs": [-1, 21, 10**9, 1.5],
}


ENGINE_PARAMS = sampling_params(512, max_logprobs=20)     # the reference model, the engine


@st.composite
def hostile_kwargs(draw) -> dict:
    """SamplingParams keyword arguments over the reference vocabulary (512): mostly
    valid, one in eight with a field the params or the engine refuse."""
    params = draw(ENGINE_PARAMS)
    kwargs = {name: getattr(params, name) for name in REFUSED}
    if draw(st.integers(0, 7)) == 0:
        name = draw(st.sampled_from(sorted(REFUSED)))
        kwargs[name] = draw(st.sampled_from(REFUSED[name]))
    kwargs["max_tokens"] = draw(st.integers(1, 6))
    kwargs["ignore_eos"] = draw(st.booleans())
    kwargs["stop_token_ids"] = tuple(draw(st.lists(st.integers(0, 511), max_size=3)))
    return kwargs


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(kwargs=hostile_kwargs(), prompt=st.lists(st.integers(0, 511), min_size=1, max_size=6))
def test_a_hostile_request_leaves_the_others_alone(engine, clean, kwargs, prompt):
    try:
        params = SamplingParams(**kwargs)
    except InvalidParam:
        return                      # a clear error at the edge
    others, _ = _run(engine, [(prompt, params)])
    assert others == clean


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [
    dict(seed=-1, temperature=0.8), dict(seed=-2**63, temperature=1.0, top_p=0.9),
    dict(seed=2**63 - 1, temperature=1.3, top_k=3), dict(top_k=5000, temperature=0.7),
    dict(top_k=10**9)], ids=["seed -1", "seed -2**63", "seed 2**63-1", "top-k 5000",
                              "top-k 10**9"])
def test_an_edge_request_runs_beside_its_n_like_companions(engine, clean, kwargs):
    """Three copies of the request (as n = 3 would send them): seeded copies draw the
    same tokens."""
    params = SamplingParams(max_tokens=6, ignore_eos=True, **kwargs)
    others, copies = _run(engine, [([9, 8, 7, 6], params)] * 3)
    assert others == clean
    assert [c.finish_reason for c in copies] == ["length"] * 3
    if params.seed is not None:
        assert copies[0].output_ids == copies[1].output_ids == copies[2].output_ids
