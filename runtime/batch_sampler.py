"""Sampling of a whole launch on the device: every row at once, one host copy per step.

runtime/sampler.py is the readable reference, one request at a time; this is the same
semantics over rows [N, vocab] with each row's parameters as tensors:

    logit bias, then penalties (repetition over prompt + output, presence and frequency
    over the output), then greedy (temperature < SAMPLING_EPS) or temperature, top-k,
    top-p, min-p and a draw; the draft of a fused MTP row is kept with probability
    p(draft) (greedy: when it is the argmax), else the row draws from p without it.

Draws use the exponential race: token = argmax(p / E), E ~ Exp(1), with E from a
counter-based hash of (row seed, output index, token id). A seeded request therefore
samples the same tokens whatever else shares its launch, and nothing here syncs the
host. Penalties read per-request token counts kept on the device (PenaltyState),
indexed by the request's state slot.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from runtime.sampling_params import SAMPLING_EPS, SamplingParams

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters of one launch, on the device. Rows: [N]."""

    temperature: torch.Tensor       # float32; < SAMPLING_EPS: greedy
    top_k: torch.Tensor             # int64; 0: off
    top_p: torch.Tensor             # float32
    min_p: torch.Tensor             # float32
    presence: torch.Tensor          # float32
    frequency: torch.Tensor         # float32
    repetition: torch.Tensor        # float32
    seed: torch.Tensor              # int64: the row's stream
    counter: torch.Tensor           # int64: output tokens so far (the draw's index)
    state: torch.Tensor             # int64: flat (rank, slot) of the row's penalty state
    bias_ids: torch.Tensor          # [N, B] int64, -1 pads
    bias: torch.Tensor              # [N, B] float32
    filtered: bool                  # any row uses top-k, top-p or min-p
    penalized: bool                 # any row has a penalty
    greedy: bool                    # every row is greedy: no distribution, no draw


class RowParamsBuilder:
    """RowParams from the rows' SamplingParams, built on the host, copied once."""

    def __init__(self, device: torch.device):
        self.device = device

    def build(self, params: list[SamplingParams], seeds: list[int], counters: list[int],
              states: list[int]) -> RowParams:
        n = len(params)
        f32 = np.zeros((7, n), np.float32)
        for i, p in enumerate(params):
            f32[:, i] = (p.temperature, p.top_p, p.min_p, p.presence_penalty,
                         p.frequency_penalty, p.repetition_penalty, max(p.top_k, 0))
        i64 = np.array([seeds, counters, states], np.int64).reshape(3, n)
        width = max((len(p.logit_bias) for p in params), default=0) or 1
        bias_ids, bias = np.full((n, width), -1, np.int64), np.zeros((n, width), np.float32)
        for i, p in enumerate(params):
            for j, (token, value) in enumerate(p.logit_bias):
                bias_ids[i, j], bias[i, j] = token, value
        floats = torch.from_numpy(f32).to(self.device)
        ints = torch.from_numpy(i64).to(self.device)
        return RowParams(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], presence=floats[3],
            frequency=floats[4], repetition=floats[5], top_k=floats[6].long(),
            seed=ints[0], counter=ints[1], state=ints[2],
            bias_ids=torch.from_numpy(bias_ids).to(self.device),
            bias=torch.from_numpy(bias).to(self.device),
            filtered=any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params),
            penalized=any(p.penalized for p in params),
            greedy=all(p.greedy for p in params))


class PenaltyState:
    """Per request state slot: how often each token occurs in its output, and which
    tokens its prompt holds. [slots, vocab]; rebuilt from the host's token lists when a
    request (re)gets a slot, advanced on the device after each step."""

    def __init__(self, slots: int, vocab: int, device: torch.device):
        self.counts = torch.zeros((slots, vocab), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((slots, vocab), dtype=torch.bool, device=device)

    def reset(self, state: int, prompt: list[int], output: list[int]) -> None:
        device = self.counts.device
        self.counts[state] = 0
        self.prompt[state] = False
        self.prompt[state, torch.tensor(prompt, dtype=torch.long, device=device)] = True
        if output:
            out = torch.tensor(output, dtype=torch.long, device=device)
            self.counts[state].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def rows(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output counts [N, V], tokens of prompt or output [N, V]) of rows' states."""
        counts = self.counts[state]
        return counts, self.prompt[state] | (counts > 0)

    def add(self, state: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor) -> None:
        """Count tokens [N, T] of rows whose state is `state` [N], where keep [N, T]."""
        flat = (state[:, None] * self.counts.shape[1] + tokens.clamp(min=0)).reshape(-1)
        self.counts.view(-1).index_add_(0, flat, keep.reshape(-1).to(torch.int32))


# -- the pieces ------------------------------------------------------------------------


def adjusted(logits: torch.Tensor, rows: RowParams, counts: torch.Tensor | None,
             seen: torch.Tensor | None, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] -> float32 with each row's bias and penalties, and -inf wherever
    the row's grammar mask `allowed` [N, V] bool is False."""
    logits = logits.float()
    ids = rows.bias_ids.clamp(min=0)
    logits = logits.scatter_add(1, ids, torch.where(rows.bias_ids >= 0, rows.bias, 0.0))
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if counts is None:
        return logits
    rep = rows.repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - rows.frequency[:, None] * counts - rows.presence[:, None] * (counts > 0)


def probabilities(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """The distribution each row samples from [N, V] (greedy rows: anything)."""
    temperature = rows.temperature.clamp(min=SAMPLING_EPS)[:, None]
    logits = logits / temperature
    if rows.filtered:
        logits = _top_k(logits, rows.top_k)
    probs = torch.softmax(logits, dim=-1)
    if rows.filtered:
        probs = _top_p(probs, rows.top_p)
        probs = probs.masked_fill(probs < rows.min_p[:, None] * probs.amax(-1, keepdim=True), 0)
    return probs / probs.sum(-1, keepdim=True)


def _top_k(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mask logits below each row's k-th largest (k = 0: none)."""
    ordered = logits.sort(dim=-1, descending=True).values
    kth = ordered.gather(1, (k.clamp(min=1) - 1)[:, None])
    return logits.masked_fill((k[:, None] > 0) & (logits < kth), float("-inf"))


def _top_p(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose mass strictly above them reaches p."""
    ordered, order = probs.sort(dim=-1, descending=True)
    above = ordered.cumsum(-1) - ordered
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, above >= p[:, None])
    return probs.masked_fill(drop, 0)


def uniform(seed: torch.Tensor, counter: torch.Tensor, lanes: int) -> torch.Tensor:
    """[N, lanes] uniforms in (0, 1), a pure function of (seed, counter, lane)."""
    lane = torch.arange(lanes, device=seed.device)
    x = _mix(seed & _MASK32) ^ _mix((seed >> 32) & _MASK32)
    x = _mix(x ^ _mix(counter & _MASK32))[:, None]
    x = _mix(x ^ lane[None, :])
    return ((x >> 8).float() + 0.5) / float(1 << 24)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) on int64 tensors kept in [0, 2^32):
    every product stays below 2^63."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)


def draw(probs: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One token per row from probs [N, V]: argmax(p / E), E = -log(U)."""
    race = -torch.log(uniform(seed, counter, probs.shape[1]))
    return (probs / race).argmax(-1)


def _greedy(rows: RowParams) -> torch.Tensor:
    return rows.temperature < SAMPLING_EPS


# -- the step's sampling ---------------------------------------------------------------


def sample(logits: torch.Tensor, rows: RowParams, counts: torch.Tensor | None,
           seen: torch.Tensor | None, allowed: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row [N] from logits [N, V] (only tokens `allowed` [N, V], if given),
    and whether the row's distribution was sound (some finite, positive mass; else the
    token means nothing)."""
    logits = adjusted(logits, rows, counts, seen, allowed)
    if rows.greedy:
        return logits.argmax(-1), torch.isfinite(logits).any(-1)
    probs = probabilities(logits, rows)
    drawn = draw(probs, rows.seed, rows.counter)
    greedy = _greedy(rows)
    sound = torch.where(greedy, torch.isfinite(logits).any(-1), torch.isfinite(probs).all(-1))
    return torch.where(greedy, logits.argmax(-1), drawn), sound


def verify(logits: torch.Tensor, draft: torch.Tensor, rows: RowParams,
           counts: torch.Tensor | None, seen: torch.Tensor | None,
           allowed: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [tail, draft] of a fused MTP step: logits [N, 2, V], drafts [N] ->
    (tokens [N, 2], accepted [N] bool, sound [N] bool): [draft, bonus] if the draft is
    kept, else [target, -]. Lossless: a kept draft is a draw from p, a rejection draws
    from p with the draft removed. allowed [N, 2, V]: each row's grammar mask at the tail
    and after the draft."""
    first = adjusted(logits[:, 0], rows, counts, seen, _at(allowed, 0))
    if rows.greedy:
        return _verify_greedy(logits, first, draft, rows, counts, seen, _at(allowed, 1))
    probs = probabilities(first, rows)
    u = uniform(rows.seed, rows.counter, probs.shape[1] + 1)[:, -1]     # a lane of its own
    p_draft = probs.gather(1, draft[:, None])[:, 0]
    rest = probs.scatter(1, draft[:, None], 0.0)
    mass = rest.sum(-1)
    kept = (u < p_draft) | (mass <= 0)          # no mass beside the draft: p(draft) was 1
    target = draw(rest / mass.clamp(min=1e-30)[:, None], rows.seed, rows.counter)
    greedy = _greedy(rows)
    greedy_target = first.argmax(-1)
    kept = torch.where(greedy, greedy_target == draft, kept)
    target = torch.where(greedy, greedy_target, target)
    if counts is not None:                     # the bonus row follows the draft
        one = torch.zeros_like(counts).scatter_(1, draft[:, None], 1)
        counts, seen = counts + one, seen | one.bool()
    after = replace(rows, counter=rows.counter + 1)
    bonus, sound = sample(logits[:, 1], after, counts, seen, _at(allowed, 1))
    sound = sound & torch.where(greedy, torch.isfinite(first).any(-1),
                                torch.isfinite(probs).all(-1))
    tokens = torch.stack((torch.where(kept, draft, target), bonus), dim=1)
    return tokens, kept, sound


def _at(allowed: torch.Tensor | None, row: int) -> torch.Tensor | None:
    return None if allowed is None else allowed[:, row]


def _verify_greedy(logits: torch.Tensor, first: torch.Tensor, draft: torch.Tensor,
                   rows: RowParams, counts: torch.Tensor | None, seen: torch.Tensor | None,
                   allowed: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """verify() when every row is greedy: the draft is kept exactly when it is the argmax."""
    target = first.argmax(-1)
    kept = target == draft
    if counts is not None:
        one = torch.zeros_like(counts).scatter_(1, draft[:, None], 1)
        counts, seen = counts + one, seen | one.bool()
    bonus, sound = sample(logits[:, 1], rows, counts, seen, allowed)
    sound = sound & torch.isfinite(first).any(-1)
    return torch.stack((torch.where(kept, draft, target), bonus), dim=1), kept, sound


def unpack_mask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Grammar bitmasks [..., ceil(V / 32)] int32 -> allowed [..., V] bool (bit t % 32 of
    word t // 32 is token t)."""
    bits = torch.arange(32, device=words.device, dtype=torch.int32)
    allowed = (words[..., None] >> bits) & 1
    return allowed.reshape(*words.shape[:-1], -1)[..., :vocab].bool()


def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
             top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's log-probs (before any adjustment) of tokens [N, T] under logits
    [N, T, V], and each position's top `top`: (lp [N, T], ids [N, T, top], lps)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    best = lp.topk(max(top, 1), dim=-1)
    return chosen, best.indices, best.values
