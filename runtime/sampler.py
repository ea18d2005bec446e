"""Sampling from logits rows, each with its own SamplingParams (vLLM semantics).

Order: logit bias, then penalties (repetition on prompt+output, presence and frequency on
output), then temperature, then top-k, top-p and min-p filtering, then a draw from the
request's own generator (seeded when the request has a seed). A temperature below
SAMPLING_EPS is greedy.

A failure here (SamplingError, or any exception) belongs to one request: the runner
reports it for that request alone and the engine goes on.
"""
from __future__ import annotations

import torch

from runtime.sampling_params import SamplingParams


class SamplingError(ValueError):
    """The request's parameters left nothing to sample from."""


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [V] float32 -> a copy with the request's biases added."""
    if not params.logit_bias:
        return logits
    ids, bias = zip(*params.logit_bias)
    logits = logits.clone()
    logits[torch.tensor(ids, device=logits.device)] += torch.tensor(bias, device=logits.device)
    return logits


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                    output: list[int]) -> torch.Tensor:
    """logits [V] float32 -> penalized copy."""
    if not params.penalized:
        return logits
    logits = logits.clone()
    if params.repetition_penalty != 1 and (prompt or output):
        seen = torch.tensor(sorted(set(prompt) | set(output)), device=logits.device)
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / params.repetition_penalty,
                                   picked * params.repetition_penalty)
    if output:
        ids, counts = torch.tensor(output, device=logits.device).unique(return_counts=True)
        logits[ids] -= params.frequency_penalty * counts.float() + params.presence_penalty
    return logits


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request samples from: [V] float32."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        ordered, order = probs.sort(descending=True)
        before = ordered.cumsum(-1) - ordered          # mass strictly above each token
        drop = order[before >= params.top_p]
        probs[drop] = 0
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0)
    return _normalized(probs)


def _normalized(probs: torch.Tensor) -> torch.Tensor:
    total = probs.sum()
    if not torch.isfinite(total) or total <= 0:
        raise SamplingError("no token has a finite, positive probability under this "
                            "request's sampling parameters")
    return probs / total


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def adjusted(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
             output: list[int]) -> torch.Tensor:
    """The logits a request samples from: [V] float32 with its bias and penalties."""
    return apply_penalties(apply_logit_bias(logits.float(), params), params, prompt, output)


def sample(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
           output: list[int], generator: torch.Generator | None) -> int:
    logits = adjusted(logits, params, prompt, output)
    if params.greedy:
        return int(logits.argmax())
    return draw(probabilities(logits, params), generator)


def verify_draft(logits: torch.Tensor, draft: int, params: SamplingParams, prompt: list[int],
                 output: list[int], generator: torch.Generator | None) -> list[int]:
    """Tokens a row [tail, draft] commits: [target] if the draft is rejected, else
    [draft, bonus]. Lossless: the draft is deterministic (the MTP argmax), so it is kept
    with probability p(draft) and a rejection draws from p with the draft removed; greedy
    keeps it exactly when it is the argmax."""
    first = adjusted(logits[0], params, prompt, output)
    if params.greedy:
        target = int(first.argmax())
        accepted = target == draft
    else:
        probs = probabilities(first, params)
        u = float(torch.rand((), generator=generator, device=probs.device))
        rest = probs.clone()
        rest[draft] = 0
        # with no mass left beside the draft, p(draft) is 1 up to rounding: keep it
        accepted = u < float(probs[draft]) or float(rest.sum()) <= 0
        if not accepted:
            target = draw(_normalized(rest), generator)
    if not accepted:
        return [target]
    bonus = sample(logits[1], params, prompt, output + [draft], generator)
    return [draft, bonus]
