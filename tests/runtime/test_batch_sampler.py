"""runtime/sampling/batch_sampler.py against the oracle (tests/runtime/sampling_oracle.py), with
the per-request state built as the model runner builds it (SamplingState.admit,
row_params, penalties, count):

    exact       bias, penalties, grammar masks, greedy choices, the probabilities of
                temperature / top-k / top-p / min-p (atol 1e-5), extremes included
    in law      draws (sample) and MTP verification of K = 1, 2, 3 drafts (each
                position's committed token, bonus included, and acceptance rate), by
                a chi-square goodness-of-fit test on DRAWS draws with fixed seeds
    streams     seeds (negative and extreme ones too) and (seed, counter) determinism

ALPHA: a chi-square test fails when its p-value is below ALPHA = 1e-6. The file asserts
39 of them, so a correct sampler fails it with probability below 39 * 1e-6 = 4e-5 over
the choice of seeds; the seeds are fixed, so a run that passes passes every time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from runtime.core.sampling_params import SamplingParams
from runtime.device.sampler import Sampler
from runtime.sampling import batch_sampler
from runtime.sampling.sampling_state import SamplingState, row_params
from tests.runtime import sampling_oracle as oracle

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
ALPHA = 1e-6
DRAWS = 20_000
V = 16


@dataclass
class Req:
    """A request's sampling side: what SamplingState.admit takes."""

    params: SamplingParams
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)

    def adjusted(self, logits, allowed=None) -> np.ndarray:
        return oracle.adjusted_logits(_f64(logits), self.params, self.prompt, self.output,
                                      None if allowed is None else _np(allowed))


def launch(reqs: list[Req], slots: list[int], seeds: list[int] | None = None,
           counters: list[int] | None = None, vocab: int = V):
    """(rows, counts, seen) of a launch whose row i belongs to request reqs[slots[i]]:
    each request admitted to its own state slot, as the model runner does."""
    state = SamplingState(len(reqs), vocab, CPU)
    for slot, req in enumerate(reqs):
        state.admit(slot, list(req.prompt), list(req.output), req.params, seed=0)
    seeds = [1000 + i for i in range(len(slots))] if seeds is None else seeds
    counters = [len(reqs[s].output) for s in slots] if counters is None else counters
    params = [reqs[s].params for s in slots]        # a slot's rows may take other streams
    rows = state.biased(row_params(params, seeds, counters, slots, CPU),
                        any(p.logit_bias for p in params))
    return rows, *state.penalties(rows)


def _f64(x) -> np.ndarray:
    return x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)


def _np(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _logits(seed: int, vocab: int = V, scale: float = 2.0) -> torch.Tensor:
    """A row of distinct float32 logits."""
    return torch.from_numpy((np.random.default_rng(seed).normal(size=vocab) * scale)
                            .astype(np.float32))


def _pack(allowed: np.ndarray) -> torch.Tensor:
    """allowed [..., V] bool -> the grammar's int32 words [..., ceil(V / 32)]."""
    vocab = allowed.shape[-1]
    words = np.zeros((*allowed.shape[:-1], (vocab + 31) // 32), np.uint32)
    for t in range(vocab):
        words[..., t // 32] |= allowed[..., t].astype(np.uint32) << np.uint32(t % 32)
    return torch.from_numpy(words.view(np.int32))


def chi_square_p(tokens, probs: np.ndarray) -> float:
    """The p-value of the draws `tokens` under `probs` [V]: cells expecting fewer than 5
    draws merged into one (and that into the smallest other cell if it still expects
    fewer); a draw of a zero-probability token fails outright."""
    tokens = _np(tokens).reshape(-1)
    n, vocab = tokens.size, probs.shape[0]
    observed = np.bincount(tokens, minlength=vocab).astype(np.float64)
    assert observed[probs == 0].sum() == 0, f"drew tokens of probability 0: {observed}"
    expected = n * probs
    big = expected >= 5
    obs, exp = list(observed[big]), list(expected[big])
    small_obs, small_exp = observed[~big].sum(), expected[~big].sum()
    if small_exp >= 5 or not exp:
        obs, exp = obs + [small_obs], exp + [small_exp]
    elif small_exp > 0:
        j = int(np.argmin(exp))
        obs[j], exp[j] = obs[j] + small_obs, exp[j] + small_exp
    obs, exp = np.array(obs), np.array(exp)
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# -- the chi-square test itself ----------------------------------------------------------


def test_the_chi_square_test_tells_a_fair_die_from_a_loaded_one():
    gen = np.random.default_rng(5)
    fair = np.full(6, 1 / 6)
    assert chi_square_p(gen.choice(6, DRAWS, p=fair), fair) > ALPHA
    loaded = np.array([0.2, 0.16, 0.16, 0.16, 0.16, 0.16])
    assert chi_square_p(gen.choice(6, DRAWS, p=loaded), fair) < ALPHA
    with pytest.raises(AssertionError, match="probability 0"):
        chi_square_p(np.array([0, 1, 5]), np.array([0.5, 0.5, 0, 0, 0, 0]))


# -- exact: bias, penalties, masks ------------------------------------------------------

EXACT = torch.tensor([3.0, -2.0, 1.5, 0.0, -0.25, 2.0, -4.0, 0.75] * 2)    # float32-exact


def test_logit_bias_is_added_through_the_dense_rows():
    reqs = [Req(SamplingParams(logit_bias=((2, 5.25), (0, -100.0)))),
            Req(SamplingParams()),                      # beside biased rows: no bias
            Req(SamplingParams(temperature=0, logit_bias=((V - 1, 100.0), (3, -0.5))))]
    rows, counts, seen = launch(reqs, [0, 1, 2, 0])
    got = batch_sampler.adjusted(EXACT.expand(4, V), rows, counts, seen)
    for row, slot in enumerate([0, 1, 2, 0]):
        np.testing.assert_array_equal(_f64(got[row]), reqs[slot].adjusted(EXACT))
    assert batch_sampler.sample(EXACT.expand(4, V), rows, counts, seen)[0][2] == V - 1


def test_penalties_follow_vllm():
    reqs = [Req(SamplingParams(repetition_penalty=2.0, presence_penalty=0.5,
                               frequency_penalty=0.25), prompt=[0, 1, 6], output=[1, 2, 2, 5]),
            Req(SamplingParams(repetition_penalty=0.5, presence_penalty=-2.0,
                               frequency_penalty=-2.0), prompt=[3, 4], output=[0, 0, 0, 9]),
            Req(SamplingParams(), prompt=[0, 1], output=[0]),        # unpenalized: as is
            Req(SamplingParams(repetition_penalty=4.0, logit_bias=((1, 4.0),)),
                prompt=[1], output=[])]
    rows, counts, seen = launch(reqs, [0, 1, 2, 3])
    got = batch_sampler.adjusted(EXACT.expand(4, V), rows, counts, seen)
    for i, req in enumerate(reqs):
        np.testing.assert_array_equal(_f64(got[i]), req.adjusted(EXACT))
    assert got[2].tolist() == EXACT.tolist()


def test_counting_committed_tokens_advances_the_penalties():
    req = Req(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25,
                             repetition_penalty=2.0), prompt=[7], output=[1])
    other = Req(SamplingParams(), prompt=[2], output=[3])
    state = SamplingState(2, V, CPU)
    for slot, r in enumerate([req, other]):
        state.admit(slot, r.prompt, r.output, r.params, seed=slot + 1)
    rows = state.rows(np.array([0, 1]), np.array([1, 1]))
    state.count(rows, torch.tensor([[4, 5, 5], [6, 6, 6]]), torch.tensor([3, 1]))
    counts, seen = state.penalties(rows)
    got = batch_sampler.adjusted(EXACT.expand(2, V), rows, counts, seen)
    after = Req(req.params, req.prompt, [1, 4, 5, 5])
    np.testing.assert_array_equal(_f64(got[0]), after.adjusted(EXACT))
    assert got[1].tolist() == EXACT.tolist()


def test_a_slot_taken_again_forgets_its_last_requests_bias_and_counts():
    state = SamplingState(2, V, CPU)
    old = Req(SamplingParams(frequency_penalty=1.0, logit_bias=((5, 50.0),)), [1], [2, 2])
    state.admit(0, old.prompt, old.output, old.params, seed=1)
    new = Req(SamplingParams(presence_penalty=0.5), prompt=[3], output=[4])
    plain = Req(SamplingParams(logit_bias=((0, 1.0),)))
    state.admit(0, new.prompt, new.output, new.params, seed=1)
    state.admit(1, plain.prompt, plain.output, plain.params, seed=2)
    rows = state.rows(np.array([0, 1]), np.array([1, 0]))
    got = batch_sampler.adjusted(EXACT.expand(2, V), rows, *state.penalties(rows))
    np.testing.assert_array_equal(_f64(got[0]), new.adjusted(EXACT))
    np.testing.assert_array_equal(_f64(got[1]), plain.adjusted(EXACT))


def test_grammar_masks_unpack_and_mask():
    gen = np.random.default_rng(3)
    for vocab in (1, 31, 32, 33, 70):
        allowed = gen.random((3, vocab)) < 0.5
        assert batch_sampler.unpack_mask(_pack(allowed), vocab).numpy().tolist() \
            == allowed.tolist()
    allowed = torch.from_numpy(gen.random((2, V)) < 0.5)
    allowed[:, 4] = True
    reqs = [Req(SamplingParams(presence_penalty=1.0), [2], [0, 4]), Req(SamplingParams())]
    rows, counts, seen = launch(reqs, [0, 1])
    got = batch_sampler.adjusted(EXACT.expand(2, V), rows, counts, seen, allowed)
    for i, req in enumerate(reqs):
        np.testing.assert_array_equal(_f64(got[i]), req.adjusted(EXACT, allowed[i]))
        assert (torch.isinf(got[i]) == ~allowed[i]).all()


# -- exact: greedy ----------------------------------------------------------------------


def test_greedy_choices_match_the_oracle():
    """Greedy rows with bias, penalties and masks, alone and beside sampled rows."""
    gen = np.random.default_rng(11)
    reqs, masks = [], []
    for _ in range(40):
        bias = tuple((int(t), float(gen.uniform(-3, 3)))
                     for t in gen.choice(V, 3, replace=False))      # a token biased once
        params = SamplingParams(temperature=float(gen.choice([0.0, 1e-7, 5e-6])),
                                repetition_penalty=float(gen.uniform(0.5, 2)),
                                frequency_penalty=float(gen.uniform(-2, 2)),
                                presence_penalty=float(gen.uniform(-2, 2)), logit_bias=bias)
        reqs.append(Req(params, gen.integers(0, V, 3).tolist(), gen.integers(0, V, 4).tolist()))
        mask = gen.random(V) < 0.6
        mask[gen.integers(0, V)] = True
        masks.append(mask)
    logits = torch.stack([_logits(100 + i) for i in range(40)])
    allowed = torch.from_numpy(np.stack(masks))
    want = [oracle.greedy_token(r.adjusted(logits[i], allowed[i])) for i, r in enumerate(reqs)]
    sampled = Req(SamplingParams(temperature=1.0, top_k=3))
    for companions in ([], [sampled]):
        rows, counts, seen = launch(reqs + companions, list(range(40 + len(companions))))
        tokens, sound = batch_sampler.sample(torch.cat([logits, logits[:len(companions)]]),
                                             rows, counts, seen,
                                             torch.cat([allowed, allowed[:len(companions)]]))
        assert tokens[:40].tolist() == want and bool(sound.all())


# 9.9999999e-6 is greedy, though float32 rounds it to SAMPLING_EPS itself
@pytest.mark.parametrize("temperature", [0.0, 1e-6, 9.99999e-6, 9.9999999e-6])
def test_a_greedy_row_takes_the_argmax_beside_sampled_rows(temperature):
    """Near-tied logits: any temperature left on a greedy row would show."""
    logits = torch.full((V,), -1.0)
    logits[3], logits[5] = 0.0, -1e-6
    greedy = Req(SamplingParams(temperature=temperature))
    assert greedy.params.greedy and oracle.greedy_token(greedy.adjusted(logits)) == 3
    sampled = Req(SamplingParams(temperature=1.0))
    for reqs in ([greedy], [greedy, sampled]):
        slots = [0] * 64 + [len(reqs) - 1]
        rows, counts, seen = launch(reqs, slots)
        tokens, sound = batch_sampler.sample(logits.expand(len(slots), V), rows, counts, seen)
        assert tokens[:64].tolist() == [3] * 64 and bool(sound.all())


# -- exact: the probabilities of every filter -------------------------------------------

TEMPERATURES = (0.5, 1.0, 1.7)
TOP_KS = (-1, 0, 1, 2, 7, V - 1, V, V + 1, 5000, 10**9, 10**18)
TOP_PS = (1e-300, 0.05, 0.5, 0.9, 1.0)
MIN_PS = (0.0, 0.05, 0.3, 1.0)
FILTERS = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
           for t in TEMPERATURES for k in TOP_KS for p in TOP_PS for m in MIN_PS]
# a huge temperature makes every probability equal, where top-p's cut is a matter of
# sort order: it goes without top-p here (test_a_huge_temperature_is_uniform has it)
FILTERS += [SamplingParams(temperature=t, top_k=k, min_p=m)
            for t in (1e30, 1e308) for k in TOP_KS for m in MIN_PS]


def _well_conditioned(adjusted: np.ndarray, params: SamplingParams) -> bool:
    """Whether float32 rounding cannot move a top-p or min-p cut of this row by more than
    the comparison's tolerance."""
    loose, tight = (oracle.distribution(adjusted, params, s) for s in (1e-5, -1e-5))
    return bool(np.abs(loose - tight).max() <= 2e-6)


def _assert_probabilities(params: list[SamplingParams], logits: torch.Tensor) -> None:
    reqs = [Req(p) for p in params]
    rows, counts, seen = launch(reqs, list(range(len(reqs))))
    got = batch_sampler.probabilities(batch_sampler.adjusted(logits, rows, counts, seen), rows)
    for i, req in enumerate(reqs):
        want = oracle.distribution(req.adjusted(logits[i]), req.params)
        np.testing.assert_allclose(_f64(got[i]), want, rtol=0, atol=1e-5, err_msg=str(req))


def test_filter_cases_are_well_conditioned():
    logits = _logits(7)
    bad = [p for p in FILTERS if not _well_conditioned(_f64(logits), p)]
    assert not bad, bad


def test_the_probabilities_of_every_filter_match_the_oracle_in_one_launch():
    _assert_probabilities(FILTERS, _logits(7).expand(len(FILTERS), V))


@pytest.mark.parametrize("temperature", TEMPERATURES + (1e308,))
def test_the_probabilities_of_every_filter_match_the_oracle_alone(temperature):
    logits = _logits(7)[None]
    for params in FILTERS:
        if params.temperature == temperature:
            _assert_probabilities([params], logits)


def test_a_huge_temperature_is_uniform():
    logits = _logits(8)
    allowed = torch.ones(V, dtype=torch.bool)
    allowed[[1, 4, 9]] = False
    for temperature in (1e30, 1e308):
        reqs = [Req(SamplingParams(temperature=temperature)),
                Req(SamplingParams(temperature=temperature, top_k=10**18)),
                Req(SamplingParams(temperature=temperature, top_p=0.5)),
                Req(SamplingParams(temperature=temperature, top_k=4))]
        rows, counts, seen = launch(reqs, [0, 1, 2, 3])
        adjusted = batch_sampler.adjusted(logits.expand(4, V), rows, counts, seen,
                                          allowed.expand(4, V))
        got = batch_sampler.probabilities(adjusted, rows).numpy()
        for row in got[:2]:
            np.testing.assert_allclose(row, np.where(allowed, 1 / 13, 0), atol=1e-6)
        # top-p 0.5 over 13 equal tokens: the smallest prefix with mass >= 0.5 is 7 long
        assert sorted(got[2][got[2] > 0].tolist()) == pytest.approx([1 / 7] * 7)
        np.testing.assert_allclose(got[3], oracle.distribution(
            reqs[3].adjusted(logits, allowed), reqs[3].params), atol=1e-6)


def test_extreme_repetition_penalties_stay_finite_and_follow_the_oracle():
    logits = torch.tensor([2.0, -3.0, 1.0, 0.5, -0.5, 0.25, 3.0, -1.0] * 2)
    prompt, output = [0, 1], [4, 4]          # seen: 0 (positive), 1 and 4 (negative)
    reqs = [Req(SamplingParams(repetition_penalty=r, temperature=t), prompt, output)
            for r in (1e-300, 1e-30, 1e30, 1e308) for t in (0.0, 1.0)]
    rows, counts, seen = launch(reqs, list(range(len(reqs))))
    adjusted = batch_sampler.adjusted(logits.expand(len(reqs), V), rows, counts, seen)
    assert torch.isfinite(adjusted).all()
    got = batch_sampler.probabilities(adjusted, rows)
    tokens, sound = batch_sampler.sample(logits.expand(len(reqs), V), rows, counts, seen)
    assert bool(sound.all())
    for i, req in enumerate(reqs):
        want = req.adjusted(logits)
        if req.params.greedy:
            assert int(tokens[i]) == oracle.greedy_token(want)
        else:
            np.testing.assert_allclose(_f64(got[i]), oracle.distribution(want, req.params),
                                       atol=1e-5)
    assert tokens[0] == tokens[1] == 0      # a tiny penalty lifts the seen positive logit


def test_top_k_holds_beside_a_saturating_penalty_and_a_huge_temperature():
    logits = torch.cat([torch.tensor([3.0]), torch.linspace(2.0, -1.0, V - 1)])
    req = Req(SamplingParams(temperature=1e30, top_k=2, repetition_penalty=1e-30), [0])
    rows, counts, seen = launch([req], [0])
    got = batch_sampler.probabilities(
        batch_sampler.adjusted(logits[None], rows, counts, seen), rows)[0]
    want = oracle.distribution(req.adjusted(logits), req.params)
    assert int((want > 0).sum()) == 2
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


# -- in law: draws ----------------------------------------------------------------------

MASK = torch.tensor([True] * 5 + [False] + [True] * 9 + [False])
DRAW_CASES = {
    "plain": (Req(SamplingParams()), None),
    "top-k": (Req(SamplingParams(temperature=0.7, top_k=5)), None),
    "top-p, min-p": (Req(SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05)), None),
    "bias, penalties, mask": (Req(SamplingParams(
        temperature=0.9, repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=-0.3,
        logit_bias=((2, 1.5), (7, -2.0), (12, 0.5))), prompt=[0, 3], output=[3, 12, 12]), MASK),
    "huge temperature, huge top-k": (Req(SamplingParams(temperature=1e308, top_k=10**18)),
                                     MASK),
}


@pytest.mark.parametrize("case", DRAW_CASES)
@pytest.mark.parametrize("stream", ["seeds", "counter"])
def test_draws_follow_the_oracles_distribution(case, stream):
    """DRAWS draws of one row: over distinct seeds at one counter, or along the counter
    of one seed."""
    req, mask = DRAW_CASES[case]
    logits = _logits(21)
    if stream == "seeds":
        seeds, counters = [7919 * i - 3 * 10**12 for i in range(DRAWS)], [3] * DRAWS
    else:
        seeds, counters = [-123456789] * DRAWS, list(range(DRAWS))
    rows, counts, seen = launch([req], [0] * DRAWS, seeds, counters)
    allowed = None if mask is None else mask.expand(DRAWS, V)
    tokens, sound = batch_sampler.sample(logits.expand(DRAWS, V), rows, counts, seen, allowed)
    assert bool(sound.all())
    want = oracle.distribution(req.adjusted(logits, mask), req.params)
    assert chi_square_p(tokens, want) > ALPHA


# -- in law: MTP verification -----------------------------------------------------------

VERIFY_REQ = Req(SamplingParams(temperature=1.0, frequency_penalty=1.5, presence_penalty=0.5,
                                logit_bias=((6, 1.0),)), prompt=[1], output=[2, 2])


def _verify_logits() -> torch.Tensor:
    logits = torch.stack([_logits(31), _logits(32)])
    logits[1, 9] = logits[1].max() + 0.5        # the draft's own token leads the bonus row
    return logits


def _verify_draws(req: Req, logits: torch.Tensor, drafts: list[int], allowed=None):
    """DRAWS verifications of one row over distinct seeds: logits [K+1, V], drafts [K],
    allowed [K+1, V] -> batch_sampler.verify's (tokens, accepted, sound)."""
    positions = len(drafts) + 1
    rows, counts, seen = launch([req], [0] * DRAWS, [31 * i + 5 for i in range(DRAWS)],
                                [len(req.output)] * DRAWS)
    allowed = None if allowed is None else allowed.expand(DRAWS, positions, V)
    return batch_sampler.verify(logits.expand(DRAWS, positions, V),
                                torch.tensor(drafts).expand(DRAWS, -1), rows, counts, seen,
                                allowed)


@pytest.mark.parametrize("draft", ["likely", "unlikely", "masked"])
def test_verification_is_lossless_and_the_bonus_follows_the_draft(draft):
    logits = _verify_logits()
    allowed = torch.ones(2, V, dtype=torch.bool)
    first = VERIFY_REQ.adjusted(logits[0])
    token = {"likely": int(np.argmax(first)), "unlikely": int(np.argsort(first)[3]),
             "masked": 9}[draft]
    if draft == "masked":
        allowed[0, token] = False
    logits[1, token] = logits[1].max() + 0.5
    tokens, accepted, sound = _verify_draws(VERIFY_REQ, logits, [token], allowed)
    kept = accepted > 0
    want_first, accept, want_bonus = oracle.verify_distribution(
        _f64(logits), VERIFY_REQ.params, VERIFY_REQ.prompt, VERIFY_REQ.output, token,
        _np(allowed))
    assert bool(sound.all())
    assert ((tokens[:, 0] == token) == kept).all()
    assert chi_square_p(tokens[:, 0], want_first) > ALPHA
    if draft == "masked":
        assert accept == 0 and not kept.any()
    else:
        assert chi_square_p(tokens[kept, 1], want_bonus) > ALPHA
        # counted as output, the draft loses its lead in the bonus row
        assert want_bonus[token] < want_bonus.max()


def test_verification_with_top_k_rejects_a_draft_outside_it():
    req = Req(SamplingParams(temperature=0.8, top_k=4, min_p=0.02))
    logits = _verify_logits()
    outside = int(np.argsort(req.adjusted(logits[0]))[0])
    tokens, accepted, sound = _verify_draws(req, logits, [outside])
    kept = accepted > 0
    want_first, accept, _ = oracle.verify_distribution(_f64(logits), req.params, [], [],
                                                       outside)
    assert accept == 0 and not kept.any() and bool(sound.all())
    assert chi_square_p(tokens[:, 0], want_first) > ALPHA


def test_a_bonus_is_the_draw_of_its_output_index():
    """A kept draft's bonus is what sample() draws for the row at the next counter with
    the draft counted: the stream is indexed by output position either way."""
    logits = _verify_logits()
    req = Req(SamplingParams(temperature=1.1, top_p=0.95, frequency_penalty=0.7), [1], [2, 2])
    draft = oracle.greedy_token(req.adjusted(logits[0]))
    n, seeds = 400, [977 * i - 5 for i in range(400)]
    tokens, accepted, _ = batch_sampler.verify(logits.expand(n, 2, V),
                                               torch.full((n, 1), draft),
                                               *launch([req], [0] * n, seeds, [2] * n))
    kept = accepted > 0
    after = Req(req.params, req.prompt, [*req.output, draft])
    bonus, _ = batch_sampler.sample(logits[1].expand(n, V),
                                    *launch([after], [0] * n, seeds, [3] * n))
    assert 0 < int(kept.sum()) < n
    assert (tokens[kept, 1] == bonus[kept]).all()


def test_greedy_verification_is_exact():
    logits = _verify_logits()
    req = Req(SamplingParams(temperature=0, frequency_penalty=2.0), output=[0])
    best = oracle.greedy_token(req.adjusted(logits[0]))
    sampled = Req(SamplingParams(temperature=1.0))
    for draft in range(V):
        _, _, bonus = oracle.verify_distribution(_f64(logits), req.params, [], req.output,
                                                 draft)
        for reqs in ([req], [req, sampled]):
            rows, counts, seen = launch(reqs, list(range(len(reqs))))
            tokens, accepted, sound = batch_sampler.verify(
                logits.expand(len(reqs), 2, V), torch.full((len(reqs), 1), draft), rows,
                counts, seen)
            kept = accepted > 0
            assert bool(kept[0]) == (draft == best) and bool(sound.all())
            assert int(tokens[0, 0]) == best
            if draft == best:
                assert int(tokens[0, 1]) == int(np.argmax(bonus))


# -- in law and exact: K drafts ---------------------------------------------------------


def _k_logits(drafts: list[int], lifts: tuple[float, ...]) -> torch.Tensor:
    """Logits [K+1, V]: draft j raised to `lifts[j]` above position j's maximum, and
    first to 0.5 above position j+1's (so that counting it as output there matters)."""
    logits = torch.stack([_logits(31 + j) for j in range(len(drafts) + 1)])
    for j, draft in enumerate(drafts):
        logits[j + 1, draft] = logits[j + 1].max() + 0.5
    for j, (draft, lift) in enumerate(zip(drafts, lifts)):
        logits[j, draft] = logits[j].max() + lift
    return logits


@pytest.mark.parametrize("drafts, lifts, masked", [
    ([9, 4], (1.0, 1.0), False),
    ([9, 4, 11], (1.0, 1.0, 1.0), False),
    ([9, 4, 11], (1.0, -1.0, 1.0), True),
], ids=["K=2", "K=3", "K=3, an unlikely second draft, masks"])
def test_k_drafts_verify_losslessly_position_by_position(drafts, lifts, masked):
    """Rows reach position j when drafts 0..j-1 were all kept; there the committed token
    is distributed as p_j (drafts 0..j-1 counted as output, the bonus at position K
    included), draft j is kept with probability p_j(draft j), and a rejected row commits
    a target that is not the draft."""
    k = len(drafts)
    logits = _k_logits(drafts, lifts)
    allowed = torch.ones(k + 1, V, dtype=torch.bool)
    if masked:
        allowed[1, [3, 12]] = False
        allowed[k, [0, 5, 9]] = False
    tokens, accepted, sound = _verify_draws(VERIFY_REQ, logits, drafts, allowed)
    req = VERIFY_REQ
    want, accept = oracle.verify_distributions(_f64(logits), req.params, req.prompt,
                                               req.output, drafts, _np(allowed))
    assert bool(sound.all()) and accepted.dtype == torch.int64
    assert 0 <= int(accepted.min()) and int(accepted.max()) == k
    for j in range(k + 1):
        reached = accepted >= j
        assert int(reached.sum()) >= 900           # enough rows for the tests to mean much
        assert chi_square_p(tokens[reached, j], want[j]) > ALPHA
        if j > 0:                                   # counting the drafts matters here
            uncounted = oracle.distribution(req.adjusted(logits[j], allowed[j]), req.params)
            assert np.abs(want[j] - uncounted).max() > 0.1
        if j < k:
            kept = accepted[reached] > j
            assert ((tokens[reached, j] == drafts[j]) == kept).all()
            assert chi_square_p(kept.long(), np.array([1 - accept[j], accept[j]])) > ALPHA


def _greedy_chain(req: Req, logits: torch.Tensor, drafts: tuple[int, ...]
                  ) -> tuple[int, int]:
    """(accepted, the token committed after the kept drafts) of a greedy row, by the
    oracle: draft j is kept while it is the argmax of position j, drafts 0..j-1 counted."""
    for j, draft in enumerate(drafts):
        after = Req(req.params, req.prompt, [*req.output, *drafts[:j]])
        best = oracle.greedy_token(after.adjusted(logits[j]))
        if draft != best:
            return j, best
    after = Req(req.params, req.prompt, [*req.output, *drafts])
    return len(drafts), oracle.greedy_token(after.adjusted(logits[len(drafts)]))


def test_greedy_verification_of_three_drafts_is_exact():
    """Every triple of drafts, alone and beside a sampled row: the accepted count is the
    run of leading drafts that are their position's argmax (earlier drafts counted in the
    penalties), and then the argmax (target or bonus) is committed."""
    logits = torch.stack([_logits(35 + j) for j in range(4)])
    logits[1, 7] = logits[1].max() + 1.0         # 7 leads position 1, unless drafted first
    req = Req(SamplingParams(temperature=0, frequency_penalty=2.0), prompt=[3], output=[0])
    triples = [tuple(int(t) for t in np.unravel_index(i, (V,) * 3)) for i in range(V**3)]
    want = [_greedy_chain(req, logits, d) for d in triples]
    assert sorted({a for a, _ in want}) == [0, 1, 2, 3]
    assert len({oracle.greedy_token(Req(req.params, req.prompt, [*req.output, d])
                                    .adjusted(logits[1])) for d in range(V)}) > 1
    sampled = Req(SamplingParams(temperature=1.0))
    for reqs in ([req], [req, sampled]):
        slots = [0] * len(triples) + [1] * (len(reqs) - 1)
        drafts = torch.tensor(triples + [(0, 0, 0)] * (len(reqs) - 1))
        tokens, accepted, sound = batch_sampler.verify(
            logits.expand(len(slots), 4, V), drafts, *launch(reqs, slots))
        assert bool(sound.all())
        for i, (a, token) in enumerate(want):
            assert int(accepted[i]) == a
            assert tokens[i, :a + 1].tolist() == [*triples[i][:a], token]


@pytest.mark.parametrize("k", [1, 2])
def test_a_bonus_is_the_draw_of_its_output_index_after_k_drafts(k):
    """Where all K drafts are kept, the bonus is what sample() draws for the row at
    counter + K with the drafts counted."""
    logits = torch.stack([_logits(31 + j) for j in range(k + 1)])
    req = Req(SamplingParams(temperature=1.1, top_p=0.95, frequency_penalty=0.7), [1], [2, 2])
    drafts = []
    for j in range(k):                          # each position's likeliest token
        after = Req(req.params, req.prompt, [*req.output, *drafts])
        drafts.append(oracle.greedy_token(after.adjusted(logits[j])))
    n, seeds = 400, [977 * i - 5 for i in range(400)]
    tokens, accepted, _ = batch_sampler.verify(logits.expand(n, k + 1, V),
                                               torch.tensor(drafts).expand(n, k),
                                               *launch([req], [0] * n, seeds, [2] * n))
    after = Req(req.params, req.prompt, [*req.output, *drafts])
    bonus, _ = batch_sampler.sample(logits[k].expand(n, V),
                                    *launch([after], [0] * n, seeds, [2 + k] * n))
    all_kept = accepted == k
    assert 0 < int(all_kept.sum()) < n
    assert (tokens[all_kept, k] == bonus[all_kept]).all()


# -- streams ----------------------------------------------------------------------------

SEEDS = [0, 1, -1, 7, -2**63, 2**63 - 1, -2**63 + 1, 2**62, 123456789, -987654321]


def _stream(seed: int, length: int = 48, vocab: int = 256) -> list[int]:
    """The first `length` tokens of a seed's stream over uniform logits."""
    req = Req(SamplingParams())
    rows, counts, seen = launch([req], [0] * length, [seed] * length, list(range(length)),
                                vocab=vocab)
    tokens, sound = batch_sampler.sample(torch.zeros(length, vocab), rows, counts, seen)
    assert bool(sound.all())
    return tokens.tolist()


def test_negative_and_extreme_seeds_draw_from_the_distribution():
    logits = _logits(41)
    req = Req(SamplingParams(temperature=1.2, top_p=0.95))
    want = oracle.distribution(req.adjusted(logits), req.params)
    for seed in (-1, -2**63, 2**63 - 1):
        rows, counts, seen = launch([req], [0] * DRAWS, [seed] * DRAWS, list(range(DRAWS)))
        tokens, sound = batch_sampler.sample(logits.expand(DRAWS, V), rows, counts, seen)
        assert bool(sound.all())
        assert chi_square_p(tokens, want) > ALPHA


def test_a_draw_depends_only_on_its_seed_counter_and_token():
    """The same (seed, counter) gives the same token and the same verification whatever
    else shares the launch and wherever the row sits in it."""
    logits, v_logits = _logits(51), torch.stack([_logits(51), _logits(52)])
    req = Req(SamplingParams(temperature=0.9, top_k=9), output=[4])
    others = [Req(SamplingParams(temperature=0)), Req(SamplingParams(top_p=0.3), [1], [2]),
              Req(SamplingParams(frequency_penalty=2, logit_bias=((3, 9.0),)), [5], [5, 6])]
    n = len(SEEDS)
    alone = launch([req], [0] * n, SEEDS, [5] * n)
    tokens = batch_sampler.sample(logits.expand(n, V), *alone)[0]
    draft = oracle.greedy_token(req.adjusted(logits))         # kept about half the time
    v_tokens, v_accepted, _ = batch_sampler.verify(v_logits.expand(n, 2, V),
                                                   torch.full((n, 1), draft), *alone)
    v_kept = v_accepted > 0
    assert 0 < int(v_kept.sum()) < n
    for at in (0, 2, 5):
        slots = [1, 2, 3, 1, 3][:at] + [0] + [2, 3]
        mixed = torch.stack([_logits(60 + j) for j in range(len(slots))])
        mixed[at] = logits
        v_mixed = torch.stack([torch.stack([_logits(70 + j), _logits(80 + j)])
                               for j in range(len(slots))])
        v_mixed[at] = v_logits
        drafts = torch.tensor([[j % V] for j in range(len(slots))])
        drafts[at] = draft
        for i, seed in enumerate(SEEDS):
            row_seeds = [seed ^ 2, ~seed, 17, 3, seed ^ 1][:at] + [seed] + [5, 6]
            counters = [5, 5, 0, 6, 4][:at] + [5] + [5, 1]
            rows, counts, seen = launch([req] + others, slots, row_seeds, counters)
            assert int(batch_sampler.sample(mixed, rows, counts, seen)[0][at]) == tokens[i]
            got, accepted, _ = batch_sampler.verify(v_mixed, drafts, rows, counts, seen)
            kept = accepted > 0
            assert bool(kept[at]) == bool(v_kept[i]) and got[at, 0] == v_tokens[i, 0]
            assert not kept[at] or got[at, 1] == v_tokens[i, 1]

def test_a_verification_of_two_drafts_depends_only_on_its_seed_counter_and_tokens():
    """K = 2: the same row verifies to the same accepted count and committed tokens
    whatever else shares the launch and wherever it sits, and its first position is
    what verifying its first draft alone gives."""
    logits = torch.stack([_logits(53 + j) for j in range(3)])
    req = Req(SamplingParams(temperature=0.9, top_k=9, presence_penalty=1.0), output=[4])
    others = [Req(SamplingParams(temperature=0)), Req(SamplingParams(top_p=0.3), [1], [2]),
              Req(SamplingParams(frequency_penalty=2, logit_bias=((3, 9.0),)), [5], [5, 6])]
    drafts = []
    for j in range(2):                          # each position's likeliest token, raised
        drafts.append(oracle.greedy_token(Req(req.params, req.prompt,
                                              [*req.output, *drafts]).adjusted(logits[j])))
        logits[j, drafts[j]] += 1.0
    n = len(SEEDS)
    alone = launch([req], [0] * n, SEEDS, [5] * n)
    tokens, accepted, _ = batch_sampler.verify(logits.expand(n, 3, V),
                                               torch.tensor(drafts).expand(n, 2), *alone)
    assert set(accepted.tolist()) == {0, 1, 2}
    first, one, _ = batch_sampler.verify(logits[:2].expand(n, 2, V),
                                         torch.tensor(drafts[:1]).expand(n, 1), *alone)
    assert ((one > 0) == (accepted > 0)).all() and (first[:, 0] == tokens[:, 0]).all()
    for at in (0, 2, 5):
        slots = [1, 2, 3, 1, 3][:at] + [0] + [2, 3]
        mixed = torch.stack([torch.stack([_logits(70 + j), _logits(80 + j), _logits(90 + j)])
                             for j in range(len(slots))])
        mixed[at] = logits
        row_drafts = torch.tensor([[j % V, (3 * j) % V] for j in range(len(slots))])
        row_drafts[at] = torch.tensor(drafts)
        for i, seed in enumerate(SEEDS):
            row_seeds = [seed ^ 2, ~seed, 17, 3, seed ^ 1][:at] + [seed] + [5, 6]
            counters = [5, 5, 0, 6, 4][:at] + [5] + [5, 1]
            rows, counts, seen = launch([req] + others, slots, row_seeds, counters)
            got, got_accepted, _ = batch_sampler.verify(mixed, row_drafts, rows, counts, seen)
            a = int(accepted[i])
            assert int(got_accepted[at]) == a
            assert got[at, :a + 1].tolist() == tokens[i, :a + 1].tolist()


def test_different_seeds_give_different_streams():
    streams = {seed: _stream(seed) for seed in SEEDS[:2] + SEEDS[3:]}
    assert len({tuple(s) for s in streams.values()}) == len(streams)
    assert all(len(set(s)) > 24 for s in streams.values())       # not stuck on a token


@pytest.mark.parametrize("a, b", [(0, -1), (1, 2**32), (0, 2**32 + 1)])
def test_seeds_with_the_same_halves_give_different_streams(a, b):
    assert _stream(a) != _stream(b)


def _old_mix(x: int) -> int:
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _folded(seed: int) -> int:
    """The 32-bit state the sampler used to fold a 64-bit seed into before it mixed in
    the counter: mix(mix(low ^ salt) ^ high)."""
    unsigned = seed % 2**64
    return _old_mix(_old_mix((unsigned & 0xFFFFFFFF) ^ 0x9E3779B9) ^ (unsigned >> 32))


def _twin(seed: int, low: int) -> int:
    """The signed 64-bit seed of low half `low` that the old fold made equal to `seed`:
    its high half cancels the difference of the two low halves' first mix."""
    unsigned = seed % 2**64
    high = unsigned >> 32 ^ _old_mix((unsigned & 0xFFFFFFFF) ^ 0x9E3779B9) \
        ^ _old_mix(low ^ 0x9E3779B9)
    twin = high << 32 | low
    assert _folded(twin) == _folded(seed) and twin != unsigned
    return twin - 2**64 if twin >= 2**63 else twin


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63 - 1, 123456789])
def test_seeds_the_old_fold_made_equal_give_different_streams(seed):
    """The sampler used to fold a seed into 32 bits before the counter, so every seed
    had 2^32 - 1 twins that drew what it drew, draw for draw."""
    for low in ((seed % 2**64) & 0xFFFFFFFF ^ 1, 7, 2**31):
        twin = _twin(seed, low)
        assert _stream(seed) != _stream(twin), (seed, twin)


def test_many_random_seeds_have_distinct_streams():
    """300,000 random 64-bit seeds (as many unseeded requests): no two share their first
    three draws. With the seed folded into 32 bits, some two did (a shared fold: even
    odds near 77k seeds, 1 - 3e-5 at 300k)."""
    seeds = torch.from_numpy(np.random.default_rng(56).integers(
        -2**63, 2**63 - 1, 300_000, dtype=np.int64, endpoint=True))
    draws = torch.cat([batch_sampler.uniform(seeds, torch.full_like(seeds, c), 4)
                       for c in range(3)], dim=1)
    assert len(torch.unique(draws, dim=0)) == len(seeds)


def test_a_stream_state_is_a_bijection_of_the_seed_at_every_counter():
    """stream_state's Feistel rounds undone give the seed back, whatever the counter."""
    seeds = torch.tensor([0, 1, -1, -2**63, 2**63 - 1, 2**32, 2**32 + 1, -2**32, 12345])
    for counter in (0, 1, 2**31, 2**40 + 3):
        a, b = batch_sampler.stream_state(seeds, torch.full_like(seeds, counter))
        keys = list(batch_sampler._ROUND_KEYS)
        keys[2] ^= counter & 0xFFFFFFFF
        keys[3] ^= counter >> 32
        for n in reversed(range(6)):
            if n % 2 == 0:
                b = b ^ batch_sampler._mix(a ^ keys[n])
            else:
                a = a ^ batch_sampler._mix(b ^ keys[n])
        assert (a | (b << 32)).tolist() == seeds.tolist()   # int64: b's top bit the sign


# uniform(seed 7, counter 15934) is at its top, 1 - 2**-24, for lane 355 (found by a
# search of seed 7's counters over 512 lanes): a draw there must still ignore tokens of
# probability 0
TOP_LANE = (7, 15934, 355)


def test_a_draw_never_takes_a_token_of_probability_zero():
    seed, counter, lane = TOP_LANE
    vocab = 512
    top = float(batch_sampler.uniform(torch.tensor([seed]), torch.tensor([counter]),
                                      vocab)[0, lane])
    assert top == 1 - 2**-24                   # the case: the largest uniform there is
    logits = torch.zeros(1, vocab)
    logits[0, 0] = 10.0
    allowed = torch.zeros(1, vocab, dtype=torch.bool)
    allowed[0, :10] = True
    for params in (SamplingParams(), SamplingParams(top_k=1), SamplingParams(top_p=0.1)):
        rows, counts, seen = launch([Req(params)], [0], [seed], [counter], vocab=vocab)
        assert int(batch_sampler.sample(logits, rows, counts, seen, allowed)[0]) < 10
        if params.top_k or params.top_p < 1:        # every other token filtered out
            assert int(batch_sampler.sample(logits, rows, counts, seen)[0]) == 0


# -- log-probs --------------------------------------------------------------------------


@pytest.mark.parametrize("top", [0, 1, V, V + 1, 5000, 10**18])
def test_logprobs_with_any_top(top):
    logits = torch.stack([_logits(90), _logits(91)])[:, None].expand(2, 3, V)
    tokens = torch.tensor([[0, 5, -1], [V - 1, 2, 3]])         # -1: a padded position
    lp, ids, values = batch_sampler.logprobs(logits, tokens, top)
    want = torch.log_softmax(logits.double(), -1)
    width = min(max(top, 1), V)
    assert ids.shape == values.shape == (2, 3, width)
    np.testing.assert_allclose(lp.numpy(), want.gather(-1, tokens.clamp(min=0)[..., None])
                               [..., 0].numpy(), atol=1e-5)
    np.testing.assert_allclose(values.numpy(), want.topk(width, -1).values.numpy(), atol=1e-5)
    assert (want.gather(-1, ids) == want.topk(width, -1).values).all()


def test_an_unseeded_request_is_seeded_from_64_random_bits():
    """The device sampler draws an unseeded request's stream from all 64 bits (either
    sign: it drew 63 before), once (a preemption keeps it); a seed given is the stream."""
    sampler = Sampler(1, 2, V, CPU, masks=None, timing=None)
    unseeded = [SimpleNamespace(request_id=str(i), params=SamplingParams())
                for i in range(2000)]
    seeds = [sampler._seed(r) for r in unseeded]
    assert len(set(seeds)) == len(seeds) and all(-2**63 <= s < 2**63 for s in seeds)
    assert min(seeds) < -2**62 and max(seeds) > 2**62
    assert [sampler._seed(r) for r in unseeded[:5]] == seeds[:5]
    seeded = SimpleNamespace(request_id="s", params=SamplingParams(seed=-5))
    assert sampler._seed(seeded) == -5
