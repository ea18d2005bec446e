"""A step's decode rows sampled on the device in one call: each request's sampling row
(its parameters and stream, written to its state slot at admission; its output index)
over the SamplingState, and the batch sampler's call, plain (one token per row) or
verifying K MTP drafts (one to K + 1 per row).

Per request, only the host's share of the work can fail alone: a request whose row
cannot be built gets a StepResult carrying the error and leaves the step."""
from __future__ import annotations

import random
import time

import numpy as np
import torch

from runtime.core.request import Request
from runtime.device.grammar_masks import GrammarMasks
from runtime.device.step_result import Sampled, StepResult, Timing
from runtime.device.upload import upload
from runtime.sampling import batch_sampler
from runtime.sampling.sampling_state import RowParams, SamplingState


class Sampler:
    """Owns the sampling state of `ranks` ranks, `states` request state slots each
    (the last one per rank is scratch), and every request's stream."""

    def __init__(self, ranks: int, states: int, vocab_size: int, device: torch.device,
                 masks: GrammarMasks, timing: Timing):
        self.states, self.device, self.masks, self.timing = states, device, masks, timing
        self.sampling = SamplingState(ranks * states, vocab_size, device)
        self._seeds: dict[str, int] = {}
        self._rng = random.Random()

    def state(self, request: Request) -> int:
        return request.rank * self.states + request.slot

    def admit(self, request: Request) -> None:
        """A request that got its slot: its parameters, stream, penalties and bias
        written to its state (read by index every step after)."""
        self.sampling.admit(self.state(request), request.prompt_ids, request.output_ids,
                            request.params, self._seed(request))

    def forget(self, request_id: str) -> None:
        self._seeds.pop(request_id, None)

    def usable(self, requests: list[Request], results) -> list[int]:
        """The positions of the requests whose own share of the step can be built: a
        constrained request's grammar mask is built now, and one that fails fails
        alone (its StepResult carries the error) and leaves the step."""
        ok = []
        for i, request in enumerate(requests):
            try:
                self.masks.check(request)
            except Exception as exc:  # noqa: BLE001 - isolated to this request
                results[request] = StepResult([], error=exc)
                continue
            ok.append(i)
        return ok

    def params(self, requests: list[Request]) -> RowParams:
        """The rows' sampling parameters, gathered from their state slots (written at
        admission): per row only its state and its output count cross."""
        n = len(requests)
        states = np.fromiter((self.state(r) for r in requests), np.int64, n)
        counters = np.fromiter((len(r.output_ids) for r in requests), np.int64, n)
        return self.sampling.rows(states, counters)

    def _seed(self, request: Request) -> int:
        """The request's stream (a signed 64-bit integer): its seed, or 64 random bits
        drawn once for it (kept across a preemption: the request takes it to its next
        slot)."""
        if request.request_id not in self._seeds:
            seed = request.params.seed
            self._seeds[request.request_id] = seed if seed is not None \
                else self._rng.getrandbits(64) - 2**63
        return self._seeds[request.request_id]

    def sample(self, requests: list[Request], logits: torch.Tensor, results) -> list[Sampled]:
        """One token per row of logits [n, V] (the rows of `requests`)."""
        t0 = time.perf_counter()
        ok = self.usable(requests, results)
        if not ok:
            return []
        kept = [requests[i] for i in ok]
        if len(kept) < len(requests):
            logits = logits[upload(ok, self.device)]
        rows_params = self.params(kept)
        counts, seen = self.sampling.penalties(rows_params)
        token, sound = batch_sampler.sample(logits, rows_params, counts, seen,
                                            self.masks.allowed(kept))
        tokens = token[:, None]
        count = torch.ones_like(token)
        self.sampling.count(rows_params, tokens, count)
        self.timing.sample += time.perf_counter() - t0
        return [Sampled(kept, tokens, count, sound, 0,
                        logits[:, None] if _logprobs_wanted(kept) else None)]

    def verify(self, requests: list[Request], logits: torch.Tensor, draft: torch.Tensor,
               tail_masks: np.ndarray | None, drafted: int) -> tuple[Sampled, torch.Tensor]:
        """Fused MTP rows (usable ones): logits [n, K+1, V] at the tail and after each of
        the drafts [n, K]; each row commits its kept drafts, then the target where one was
        rejected or the bonus token where all were kept. Returns the sampled rows (count:
        1 + accepted) and `accepted` [n] int64, the drafts kept per row."""
        t0 = time.perf_counter()
        rows_params = self.params(requests)
        counts, seen = self.sampling.penalties(rows_params)
        allowed = self.masks.allowed_after_draft(requests, tail_masks, draft)
        tokens, accepted, sound = batch_sampler.verify(logits, draft, rows_params, counts,
                                                       seen, allowed)
        count = 1 + accepted
        self.sampling.count(rows_params, tokens, count)
        self.timing.sample += time.perf_counter() - t0
        return Sampled(requests, tokens, count, sound, drafted,
                       logits if _logprobs_wanted(requests) else None), accepted


def _logprobs_wanted(requests: list[Request]) -> bool:
    return any(r.params.logprobs is not None for r in requests)
