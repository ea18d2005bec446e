"""What a step hands back: each request's StepResult, built from every launch's sampled
rows in one copy to the host (`to_host`), and the step's time by phase."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from runtime.core.request import Request
from runtime.sampling import batch_sampler


class SamplingFailure(RuntimeError):
    """A request's sampling distribution had no finite, positive mass."""


class TokenLogprobs(msgspec.Struct, array_like=True):
    """A sampled token's log-prob and the top alternatives; sent between processes as an
    array (no field names per token)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class StepResult:
    """What one step produced for one request."""

    tokens: list[int]
    logprobs: list[TokenLogprobs] | None = None
    drafted: int = 0          # MTP draft tokens verified this step
    accepted: int = 0
    error: Exception | None = None    # this request's share of the step failed (no tokens)


@dataclass
class Timing:
    marshal: float = 0.0
    kernel: float = 0.0
    sample: float = 0.0


@dataclass
class Sampled:
    """One launch's sampled rows, still on the device until the step's copy."""

    requests: list[Request]
    tokens: torch.Tensor          # [n, T] int64
    count: torch.Tensor           # [n] tokens each row commits
    sound: torch.Tensor           # [n] bool
    drafted: int = 0
    logits: torch.Tensor | None = None    # [n, T, V], kept only when log-probs are asked


@dataclass
class Decoded:
    """One decode launch's usable rows, copied out of its output buffers (the next
    launch reuses them) until the step samples every launch's rows at once."""

    requests: list[Request]
    logits: torch.Tensor                  # [n, V], fused MTP: [n, K + 1, V]
    draft: torch.Tensor | None = None     # [n, K] the MTP drafts (fused)
    tail_masks: np.ndarray | None = None  # [n, words] grammar masks (fused, constrained)
    hidden: torch.Tensor | None = None    # [n, ...] the MTP layer's input (fused)

    @staticmethod
    def joined(parts: list[Decoded]) -> Decoded:
        """The launches' rows as one batch, in order."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        return Decoded([r for p in parts for r in p.requests],
                       torch.cat([p.logits for p in parts]),
                       None if first.draft is None else torch.cat([p.draft for p in parts]),
                       _joined_masks(parts),
                       None if first.hidden is None else torch.cat([p.hidden for p in parts]))


def _joined_masks(parts: list[Decoded]) -> np.ndarray | None:
    """The launches' grammar masks as one array (a launch without constrained rows
    allows every token); None when no launch has any."""
    given = [p.tail_masks for p in parts if p.tail_masks is not None]
    if not given:
        return None
    words = given[0].shape[1]
    return np.concatenate([p.tail_masks if p.tail_masks is not None
                           else np.full((len(p.requests), words), -1, np.int32)
                           for p in parts])


def read(values: torch.Tensor) -> np.ndarray:
    """The step's one copy from the device to the host (float64 [n])."""
    return values.cpu().numpy()


def to_host(sampled: list[Sampled], max_logprobs: int) -> dict[Request, StepResult]:
    """Every launch's tokens, counts, soundness (and log-probs) in one transfer."""
    if not sampled:
        return {}
    parts = []
    for s in sampled:
        parts += [s.tokens.reshape(-1).double(), s.count.double(), s.sound.double()]
        if s.logits is not None:
            lp, ids, vals = batch_sampler.logprobs(s.logits, s.tokens, max_logprobs)
            parts += [lp.reshape(-1).double(), ids.reshape(-1).double(),
                      vals.reshape(-1).double()]
    host = read(torch.cat(parts))
    results, at = {}, 0
    for s in sampled:
        n, width = s.tokens.shape
        tokens = host[at: at + n * width].reshape(n, width).astype(np.int64)
        count = host[at + n * width: at + n * width + n].astype(np.int64)
        sound = host[at + n * width + n: at + n * width + 2 * n].astype(bool)
        at += n * width + 2 * n
        logprobs = None
        if s.logits is not None:
            top = batch_sampler.top_width(max_logprobs, s.logits.shape[-1])
            logprobs, at = _unpack_logprobs(host, at, n, width, top)
        rows = zip(s.requests, tokens.tolist(), count.tolist(), sound.tolist())
        if logprobs is None and s.drafted:
            results.update((request, StepResult(row[:n], None, s.drafted, n - 1) if ok
                            else _unsound()) for request, row, n, ok in rows)
        elif logprobs is None:
            results.update((request, StepResult(row[:n]) if ok else _unsound())
                           for request, row, n, ok in rows)
        else:
            for i, (request, row, n, ok) in enumerate(rows):
                results[request] = _result(request, row[:n], ok, s.drafted, logprobs, i)
    return results


def _unsound() -> StepResult:
    return StepResult([], error=SamplingFailure(
        "no token has a finite, positive probability under this request's sampling "
        "parameters"))


def _result(request: Request, tokens: list[int], sound: bool, drafted: int,
            logprobs, i: int) -> StepResult:
    if not sound:
        return _unsound()
    lps = None
    if request.params.logprobs is not None:
        chosen, ids, vals = logprobs
        top = request.params.logprobs
        lps = [TokenLogprobs(t, float(chosen[i, j]),
                             list(zip(ids[i, j, :top].tolist(), vals[i, j, :top].tolist())))
               for j, t in enumerate(tokens)]
    return StepResult(tokens, lps, drafted=drafted, accepted=len(tokens) - 1 if drafted else 0)


def _unpack_logprobs(host: np.ndarray, at: int, n: int, width: int, top: int):
    size = n * width
    chosen = host[at: at + size].reshape(n, width)
    ids = host[at + size: at + size + size * top].reshape(n, width, top).astype(np.int64)
    vals = host[at + size + size * top: at + size + 2 * size * top].reshape(n, width, top)
    return (chosen, ids, vals), at + size + 2 * size * top
