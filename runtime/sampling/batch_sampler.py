"""Sampling of a whole launch on the device: every row at once, one host copy per step.

vLLM's semantics over rows [N, vocab], each row with its own parameters (RowParams,
runtime/sampling/sampling_state.py):

    logit bias, then penalties (repetition over prompt + output, presence and frequency
    over the output), then the grammar mask, then greedy (temperature < SAMPLING_EPS) or
    temperature, top-k, top-p, min-p and a draw; each of the K drafts of a fused MTP row,
    in turn, is kept with probability p(draft) (greedy: when it is the argmax), else the
    row draws from p without it and stops there.

Draws use the exponential race: token = argmax(p / E), E ~ Exp(1), with E from a
counter-based hash of (row seed, output index, token id), its state 64 bits wide
(stream_state: distinct seeds, distinct streams). A seeded request therefore
samples the same tokens whatever else shares its launch, and nothing here syncs the
host. Whatever the parameters, the arithmetic stays finite: adjusted logits are clamped
to float32's range before the mask, and the temperature divides logits minus their row
maximum (<= 0), so only a row with no allowed token (or NaN logits) comes out unsound.

tests/runtime/test_batch_sampler.py checks every piece against an independent oracle.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from runtime.core.sampling_params import SAMPLING_EPS
from runtime.sampling.sampling_state import F32_MAX, RowParams

_MASK32 = 0xFFFFFFFF
# stream_state's round keys: arbitrary 32-bit constants, distinct so that no two rounds
# are alike
_ROUND_KEYS = (0x9E3779B9, 0x7F4A7C15, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F, 0x165667B1)


# -- the pieces ------------------------------------------------------------------------


def adjusted(logits: torch.Tensor, rows: RowParams, counts: torch.Tensor | None,
             seen: torch.Tensor | None, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] -> float32 with each row's bias and penalties, clamped to float32's
    finite range (a penalty that overflows gives the largest logit; NaN stays NaN), and
    -inf wherever the row's grammar mask `allowed` [N, V] bool is False."""
    logits = logits.float()
    if rows.bias is not None:
        logits = logits + rows.bias
    if counts is not None:
        rep = rows.repetition[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        logits = logits - rows.frequency[:, None] * counts - rows.presence[:, None] * (counts > 0)
    logits = logits.clamp(-F32_MAX, F32_MAX)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """The distribution each row samples from [N, V] (greedy rows: anything). The row's
    maximum is subtracted before the temperature divides, so no temperature overflows."""
    if rows.filtered:               # on the logits themselves: a temperature can round
        logits = _top_k(logits, rows.top_k)    # distinct logits into ties
    temperature = rows.temperature.clamp(min=SAMPLING_EPS)[:, None]
    probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / temperature, dim=-1)
    if rows.filtered:
        probs = _top_p(probs, rows.top_p)
        probs = probs.masked_fill(probs < rows.min_p[:, None] * probs.amax(-1, keepdim=True), 0)
    return probs / probs.sum(-1, keepdim=True)


def _top_k(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mask logits below each row's k-th largest (k = 0, or k at or above the
    vocabulary: none)."""
    ordered = logits.sort(dim=-1, descending=True).values
    kth = ordered.gather(1, (k.clamp(1, logits.shape[-1]) - 1)[:, None])
    return logits.masked_fill((k[:, None] > 0) & (logits < kth), float("-inf"))


def _top_p(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose mass strictly above them reaches p; the most likely token stays
    whatever p is (a p that rounds to 0 in float32 keeps it alone)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    cut = ((ordered.cumsum(-1) - ordered) >= p[:, None]) & (p < 1)[:, None]   # float32 sums
    cut[:, 0] = False                                                           # reach 1 early
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, cut)
    return probs.masked_fill(drop, 0)


def uniform(seed: torch.Tensor, counter: torch.Tensor, lanes: int) -> torch.Tensor:
    """[N, lanes] uniforms in (0, 1), a pure function of (seed, counter, lane): lane l
    of a row hashes the draw's key (the first word of stream_state(seed, counter)) with
    l. 23 bits per uniform, so (u + 0.5) / 2^23 is exact in float32 and never 1 (E =
    -log(U) is then never 0, which would make p / E NaN for p = 0).

    Two draws share their uniforms only when their 32-bit keys match (2^-32 for two
    draws), never a whole stream: that takes the keys of every counter to match."""
    key, _ = stream_state(seed, counter)
    lane = torch.arange(lanes, device=seed.device)
    x = _mix(key[:, None] ^ lane[None, :])
    return ((x >> 9).float() + 0.5) / float(1 << 23)


def stream_state(seed: torch.Tensor, counter: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The 64-bit state of draw `counter` of stream `seed` (both [N] int64): two 32-bit
    words (a, b) [N] int64 in [0, 2^32). The seed's halves go through Feistel rounds
    (b ^= mix(a ^ key), then a ^= mix(b ^ key), ...), the counter's halves keyed into
    the middle two: each round can be undone, so at any counter distinct 64-bit seeds
    have distinct states. (A fold of the seed to 32 bits before the counter, as this
    was, makes seeds share whole streams, and two of 77k unseeded requests share one
    with even odds.) Counters are output indices, so below 2^63; the round keys keep
    seed 0 off mix's fixed point 0."""
    a, b = seed & _MASK32, (seed >> 32) & _MASK32
    low, high = counter & _MASK32, (counter >> 32) & _MASK32
    keys = (_ROUND_KEYS[0], _ROUND_KEYS[1], low ^ _ROUND_KEYS[2], high ^ _ROUND_KEYS[3],
            _ROUND_KEYS[4], _ROUND_KEYS[5])
    for n, key in enumerate(keys):
        if n % 2 == 0:
            b = b ^ _mix(a ^ key)
        else:
            a = a ^ _mix(b ^ key)
    return a, b


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
    """A fused MTP step's rows [tail, draft 0, .., draft K-1]: logits [N, K+1, V], drafts
    [N, K] -> (tokens [N, K+1], accepted [N] int64, sound [N] bool). Row i commits
    tokens[i, :a + 1], a = accepted[i]: its first a drafts, then the target drawn where
    draft a was rejected, or (a = K) the bonus sampled at position K; entries past a mean
    nothing. Lossless: position j keeps draft j with probability p_j(draft j), else draws
    from p_j without it, p_j counting drafts 0..j-1 as output, its draws at counter
    rows.counter + j. sound: positions 0..a were. allowed [N, K+1, V]: each row's grammar
    mask at the tail and after each draft."""
    k = draft.shape[1]
    tokens = []
    reached = torch.ones(draft.shape[0], dtype=torch.bool, device=draft.device)  # 0..j-1 kept
    accepted = torch.zeros(draft.shape[0], dtype=torch.long, device=draft.device)
    sound = reached
    for j in range(k):
        at = replace(rows, counter=rows.counter + j)
        target, kept, ok = _verify_at(logits[:, j], draft[:, j], at, counts, seen,
                                      _at(allowed, j))
        tokens.append(torch.where(kept, draft[:, j], target))
        sound = sound & (ok | ~reached)
        reached = reached & kept
        accepted = accepted + reached.long()
        counts, seen = _counted(counts, seen, draft[:, j])
    bonus, ok = sample(logits[:, k], replace(rows, counter=rows.counter + k), counts, seen,
                       _at(allowed, k))
    tokens.append(bonus)
    return torch.stack(tokens, dim=1), accepted, sound & (ok | ~reached)


def _verify_at(logits: torch.Tensor, draft: torch.Tensor, rows: RowParams,
               counts: torch.Tensor | None, seen: torch.Tensor | None,
               allowed: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One position of verify(): logits [N, V], drafts [N] -> (target [N], kept [N] bool,
    sound [N] bool). The draft is kept when the uniform of lane V (a lane of its own) at
    rows.counter is below p(draft) (greedy: when it is the argmax); the target is drawn at
    that counter from p with the draft removed (greedy: the argmax; never the draft)."""
    scores = adjusted(logits, rows, counts, seen, allowed)
    best = scores.argmax(-1)
    if rows.greedy:
        return best, best == draft, torch.isfinite(scores).any(-1)
    probs = probabilities(scores, rows)
    u = uniform(rows.seed, rows.counter, probs.shape[1] + 1)[:, -1]     # a lane of its own
    p_draft = probs.gather(1, draft[:, None])[:, 0]
    rest = probs.scatter(1, draft[:, None], 0.0)
    mass = rest.sum(-1)
    kept = (u < p_draft) | (mass <= 0)          # no mass beside the draft: p(draft) was 1
    target = draw(rest / mass.clamp(min=1e-30)[:, None], rows.seed, rows.counter)
    greedy = _greedy(rows)
    sound = torch.where(greedy, torch.isfinite(scores).any(-1), torch.isfinite(probs).all(-1))
    return (torch.where(greedy, best, target), torch.where(greedy, best == draft, kept),
            sound)


def _counted(counts: torch.Tensor | None, seen: torch.Tensor | None, tokens: torch.Tensor
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The penalties (counts, seen) [N, V] once each row's token [N] is output too."""
    if counts is None:
        return counts, seen
    one = torch.zeros_like(counts).scatter_(1, tokens[:, None], 1)
    return counts + one, seen | one.bool()


def _at(allowed: torch.Tensor | None, row: int) -> torch.Tensor | None:
    return None if allowed is None else allowed[:, row]


def unpack_mask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Grammar bitmasks [..., ceil(V / 32)] int32 -> allowed [..., V] bool (bit t % 32 of
    word t // 32 is token t)."""
    bits = torch.arange(32, device=words.device, dtype=torch.int32)
    allowed = (words[..., None] >> bits) & 1
    return allowed.reshape(*words.shape[:-1], -1)[..., :vocab].bool()


def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
             top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's log-probs (before any adjustment) of tokens [N, T] under logits
    [N, T, V], and each position's top `top` (at most V): (lp [N, T], ids [N, T, top],
    lps)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    best = lp.topk(top_width(top, lp.shape[-1]), dim=-1)
    return chosen, best.indices, best.values


def top_width(top: int, vocab: int) -> int:
    """How many top log-probs logprobs() gives per position for `top`."""
    return min(max(top, 1), vocab)
