"""Sampling: penalties, filters, seeds, and lossless draft verification."""
from __future__ import annotations

import pytest
import torch

from runtime import sampler
from runtime.sampling_params import SamplingParams


def test_greedy_takes_the_argmax():
    logits = torch.tensor([0.1, 3.0, 2.0])
    assert sampler.sample(logits, SamplingParams(temperature=0), [], [], None) == 1


def test_penalties_follow_vllm():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = sampler.apply_penalties(logits, params, prompt=[0], output=[1, 2, 2])
    assert out.tolist() == pytest.approx([1.0, -4.0 - 0.75, 0.5 - 1.0, 0.5])


def test_filters_remove_the_tail():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_k = sampler.probabilities(logits, SamplingParams(top_k=2))
    assert top_k[2:].sum() == 0 and top_k.sum() == pytest.approx(1)
    top_p = sampler.probabilities(logits, SamplingParams(top_p=0.7))
    assert (top_p > 0).tolist() == [True, True, False, False]
    min_p = sampler.probabilities(logits, SamplingParams(min_p=0.2))
    assert (min_p > 0).tolist() == [True, True, True, False]


def test_the_reference_sampler_repeats_with_a_seeded_generator():
    """The readable reference draws from the generator it is given (the engine's seeds
    go through the batch sampler: tests/runtime/test_engine.py)."""
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0, seed=7)

    def run():
        gen = torch.Generator().manual_seed(7)
        return [sampler.sample(logits, params, [], [], gen) for _ in range(20)]

    assert run() == run() and len(set(run())) > 1


def test_verification_is_lossless_in_distribution():
    """With a deterministic draft, the first committed token is distributed as the
    target distribution, whatever the draft."""
    target = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    logits = torch.stack([target, target])
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(6000):
        counts[sampler.verify_draft(logits, 1, params, [], [], gen)[0]] += 1
    assert (counts / counts.sum()).tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.025)


def test_greedy_verification_accepts_exactly_the_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0]])
    greedy = SamplingParams(temperature=0)
    assert sampler.verify_draft(logits, 1, greedy, [], [], None) == [1, 0]
    assert sampler.verify_draft(logits, 2, greedy, [], [], None) == [1]


def test_logit_bias_is_added_before_the_choice():
    logits = torch.tensor([3.0, 1.0, 0.0])
    params = SamplingParams(temperature=0, logit_bias=((2, 5.0), (0, -100.0)))
    assert sampler.adjusted(logits, params, [], []).tolist() == [-97.0, 1.0, 5.0]
    assert sampler.sample(logits, params, [], [], None) == 2


def test_a_temperature_below_the_epsilon_is_greedy():
    assert SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_top_k_minus_one_is_off():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    probs = sampler.probabilities(logits, SamplingParams(top_k=-1))
    assert probs.tolist() == pytest.approx([0.5, 0.3, 0.2])


def test_nothing_left_to_sample_is_a_sampling_error():
    logits = torch.full((4,), float("-inf"))
    with pytest.raises(sampler.SamplingError, match="no token has a finite"):
        sampler.sample(logits, SamplingParams(temperature=1.0), [], [], torch.Generator())

