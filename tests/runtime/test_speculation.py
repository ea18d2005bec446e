"""The speculation policies without a model: fixed K, and the adaptive choice of K from
measured step costs and running acceptance (runtime/core/speculation.py), driven by a
simulated decode whose true costs and acceptance the test sets."""
from __future__ import annotations

import random

import pytest

from runtime.core.speculation import AdaptiveSpeculation, Speculation, make


def test_the_fixed_policy_is_its_k_every_step():
    policy = make("fixed", 2)
    assert type(policy) is Speculation and policy.ks == (2,)
    assert {policy.choose(rows) for rows in (1, 5, 64)} == {2}
    assert type(make("adaptive", 0)) is Speculation      # nothing to choose among


class Simulated:
    """A decode with per-position acceptance `rates` and step seconds cost(k, rows)."""

    def __init__(self, rates, cost, noise=0.0, seed=0):
        self.rates, self.cost, self.noise = rates, cost, noise
        self.rng = random.Random(seed)

    def step(self, policy, rows: int, k: int | None = None) -> tuple[int, float]:
        """One decode step of `rows` rows at the policy's K (or `k`): tokens, seconds."""
        k = policy.choose(rows) if k is None else k
        reached, kept, tokens = [0] * k, [0] * k, 0
        for _ in range(rows):
            a = 0
            while a < k and self.rng.random() < self.rates[a]:
                a += 1
            for j in range(min(a + 1, k)):
                reached[j] += 1
            for j in range(a):
                kept[j] += 1
            tokens += a + 1
        seconds = self.cost(k, rows) * (1 + self.noise * self.rng.uniform(-1, 1))
        policy.observe(k, rows, seconds, reached, kept)
        return tokens, seconds


def _rate(sim: Simulated, policy, rows: int, steps: int, k: int | None = None) -> float:
    tokens = seconds = 0.0
    for _ in range(steps):
        t, s = sim.step(policy, rows, k)
        tokens, seconds = tokens + t, seconds + s
    return tokens / seconds


def test_each_k_is_measured_before_any_is_chosen_for_its_rate():
    policy = AdaptiveSpeculation(3)
    sim = Simulated([0.9] * 3, lambda k, rows: 1.0)
    for _ in range(4):
        sim.step(policy, 4)
    assert policy.chosen == {0: 1, 1: 1, 2: 1, 3: 1}
    assert sorted(policy.costs) == [(0, 3), (1, 3), (2, 3), (3, 3)]     # rows 4: bucket 3


def test_a_slow_first_measurement_does_not_decide():
    """K=3's first step is ten times slower (a first use): a probe measures it again,
    the lower median of its measurements drops the slow one, and K=3, the best by far,
    is chosen from then on."""
    policy = AdaptiveSpeculation(3)
    seen: set[int] = set()

    def cost(k: int, rows: int) -> float:
        first = k not in seen
        seen.add(k)
        return (10.0 if first and k == 3 else 1.0) + 0.1 * k

    sim = Simulated([0.9] * 3, cost)
    for _ in range(4 * policy.probe_every):
        sim.step(policy, 1)
    assert [policy.choose(1) for _ in range(8)].count(3) >= 6      # probes aside


@pytest.mark.parametrize("rate, best", [(0.9, 3), (0.5, 1), (0.05, 0)])
def test_the_choice_follows_acceptance_against_cost(rate, best):
    """A step of K drafts costs 1 + 0.4 K: worth three drafts at 90% acceptance, one at
    50%, none at 5%."""
    policy = AdaptiveSpeculation(3)
    sim = Simulated([rate] * 3, lambda k, rows: 1 + 0.4 * k)
    for _ in range(300):
        sim.step(policy, 2)
    last = [policy.choose(2) for _ in range(31)]     # a probe may land in these
    assert max(set(last), key=last.count) == best


def test_row_buckets_learn_their_own_costs():
    """Drafts are nearly free for one row and cost their full width for 64 (a step that
    is bound by reading the weights, then by compute): K=3 for one row, K=0 for 64."""
    policy = AdaptiveSpeculation(3)
    sim = Simulated([0.6] * 3, lambda k, rows: 1.0 + 0.02 * k if rows < 8
                    else 1.0 + 0.9 * k)
    for _ in range(200):
        sim.step(policy, 1)
        sim.step(policy, 64)
    assert policy.choose(1) == 3 and policy.choose(64) == 0


def test_a_probe_revisits_the_k_measured_longest_ago():
    """Drafts never kept: K=0 wins, and each other K is tried again once in a while."""
    policy = AdaptiveSpeculation(2, probe_every=8)
    sim = Simulated([0.0] * 2, lambda k, rows: 1 + k)
    for _ in range(64):
        sim.step(policy, 1)
    # warm-up, then a probe of two steps every 8 (the last one's second step is the 65th)
    assert policy.chosen[1] + policy.chosen[2] == 2 + 2 * 64 // 8 - 1
    assert policy.chosen[1] >= 7 and policy.chosen[2] >= 7          # in turn
    assert policy.chosen[0] == 64 - 17


def test_acceptance_is_per_position_and_an_unseen_position_takes_the_previous_rate():
    policy = AdaptiveSpeculation(3)
    policy.observe(1, 10, None, [10], [8])
    assert policy.expected_tokens(1) == pytest.approx(1.8)
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    policy.observe(2, 10, None, [10, 5], [5, 1])
    decay = AdaptiveSpeculation.DECAY
    a1 = (8 * decay ** 10 + 5) / (10 * decay ** 10 + 10)
    assert policy.expected_tokens(2) == pytest.approx(1 + a1 + a1 * 0.2)


def test_acceptance_that_changes_is_followed():
    """Prompts that were easy to draft, then hard: the policy moves from K=3 to K=0."""
    policy = AdaptiveSpeculation(3)
    cost = lambda k, rows: 1 + 0.5 * k          # noqa: E731
    easy, hard = Simulated([0.95] * 3, cost), Simulated([0.05] * 3, cost)
    for _ in range(200):
        easy.step(policy, 4)
    assert policy.choose(4) == 3
    for _ in range(400):
        hard.step(policy, 4)
    assert policy.choose(4) == 0


@pytest.mark.parametrize("rates, cost", [
    ([0.7, 0.6, 0.5], lambda k, rows: 1 + 0.15 * k),
    ([0.6] * 3, lambda k, rows: 1 + 0.65 * k),
    ([0.3] * 3, lambda k, rows: 1 + 0.1 * k),
    ([0.8] * 3, lambda k, rows: (1 + 0.05 * k) if rows < 8 else rows / 8 * (1 + 0.7 * k)),
], ids=["cheap-drafts", "dear-drafts", "rare-acceptance", "by-load"])
@pytest.mark.parametrize("rows", [1, 16])
def test_adaptive_throughput_is_within_5_percent_of_the_best_fixed_k(rates, cost, rows):
    """On a noisy simulated machine (costs +-10% per step) over 600 steps."""
    fixed = [_rate(Simulated(rates, cost, 0.1, seed=k), Speculation(k), rows, 600)
             for k in range(4)]
    adaptive = _rate(Simulated(rates, cost, 0.1, seed=9), AdaptiveSpeculation(3), rows, 600)
    assert adaptive >= 0.95 * max(fixed), (adaptive, fixed)
