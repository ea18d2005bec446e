"""Sampling from logits rows, each with its own SamplingParams (vLLM semantics).

Order: penalties (repetition on prompt+output, presence and frequency on output), then
temperature, then top-k, top-p and min-p filtering, then a draw from the request's own
generator (seeded when the request has a seed). Temperature 0 is greedy.
"""
from __future__ import annotations

import torch

from runtime.sampling_params import SamplingParams


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
    if params.top_k and params.top_k < logits.shape[-1]:
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
    return probs / probs.sum()


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
           output: list[int], generator: torch.Generator | None) -> int:
    logits = apply_penalties(logits.float(), params, prompt, output)
    if params.greedy:
        return int(logits.argmax())
    return draw(probabilities(logits, params), generator)


def verify_draft(logits: torch.Tensor, draft: int, params: SamplingParams, prompt: list[int],
                 output: list[int], generator: torch.Generator | None) -> list[int]:
    """Tokens a row [tail, draft] commits: [target] if the draft is rejected, else
    [draft, bonus]. Lossless: the draft is deterministic (the MTP argmax), so it is kept
    with probability p(draft) and a rejection draws from p with the draft removed; greedy
    keeps it exactly when it is the argmax."""
    first = apply_penalties(logits[0].float(), params, prompt, output)
    if params.greedy:
        target = int(first.argmax())
        accepted = target == draft
    else:
        probs = probabilities(first, params)
        accepted = float(torch.rand((), generator=generator, device=probs.device)) \
            < float(probs[draft])
        if not accepted:
            probs[draft] = 0
            target = draw(probs / probs.sum(), generator)
    if not accepted:
        return [target]
    bonus = sample(logits[1], params, prompt, output + [draft], generator)
    return [draft, bonus]
