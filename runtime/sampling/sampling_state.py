"""The sampling side of a launch's rows on the device: their parameters as tensors
(RowParams), and what each request keeps there between steps (SamplingState).

Every value a SamplingParams admits must be representable here: a parameter that
validates but overflows its tensor would fail the shared step, not its request. So

    seed          any signed 64-bit integer, held as int64 as it is (no unsigned view)
    top_k         int64, capped at 2**31 (any k at or above the vocabulary means "off")
    temperature   float32, capped at its largest finite value (a larger one is uniform);
                  0 for a greedy row (a temperature just below SAMPLING_EPS rounds to it)
    repetition    float32 in [smallest normal, largest finite]: a tiny penalty never
                  becomes 0 (a division by zero), a huge one never inf (0 * inf = NaN)

Per request state slot (rank * slots_per_rank + slot), allocated at the first request
that needs it and written when a request gets its slot (admission, re-admission after
preemption), never per step:

    params  ParamTable (host)      its sampling parameters and stream, gathered by
                                   slot into each step's RowParams
    counts  [slots, vocab] int32   output token counts (penalties), advanced per step
    prompt  [slots, vocab] bool    tokens of the prompt (repetition penalty)
    bias    [slots, vocab] float32 the request's logit bias, dense (zero elsewhere)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from runtime.core.sampling_params import SamplingParams

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)       # the smallest positive normal float32
TOP_K_CAP = 2**31


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
    state: torch.Tensor             # int64: the row's request state slot
    bias: torch.Tensor | None       # [N, V] float32 logit bias; None: no row has one
    filtered: bool                  # any row uses top-k, top-p or min-p
    penalized: bool                 # any row has a penalty
    greedy: bool                    # every row is greedy: no distribution, no draw


def row_params(params: list[SamplingParams], seeds: list[int], counters: list[int],
               states: list[int], device: torch.device) -> RowParams:
    """RowParams from the rows' SamplingParams (a row a stream, as the benchmarks and
    the sampler's tests give them): through a ParamTable of their own, two copies to the
    device; no bias rows (SamplingState.biased adds the requests' own)."""
    table = ParamTable(len(params))
    for i, (p, seed) in enumerate(zip(params, seeds)):
        table.write(i, p, seed)
    return table.rows(np.arange(len(params)), np.asarray(counters, np.int64),
                      np.asarray(states, np.int64), device)


class ParamTable:
    """Rows of sampling parameters on the host, one per slot, written once (a request's
    admission) and read by index per launch: a launch's RowParams is a gather, not a
    loop over its requests' SamplingParams."""

    def __init__(self, slots: int):
        # temperature (0: greedy), top_p, min_p, presence, frequency, repetition
        self.floats = np.zeros((slots, 6), np.float32)
        self.ints = np.zeros((slots, 2), np.int64)          # top_k, seed
        # filtered, penalized, greedy, biased
        self.flags = np.zeros((slots, 4), bool)

    def write(self, slot: int, p: SamplingParams, seed: int) -> None:
        self.floats[slot] = (0.0 if p.greedy else min(p.temperature, F32_MAX), p.top_p,
                             p.min_p, p.presence_penalty, p.frequency_penalty,
                             min(max(p.repetition_penalty, F32_TINY), F32_MAX))
        self.ints[slot] = (min(max(p.top_k, 0), TOP_K_CAP), seed)
        self.flags[slot] = (p.top_k > 0 or p.top_p < 1 or p.min_p > 0, p.penalized,
                            p.greedy, bool(p.logit_bias))

    def rows(self, slots: np.ndarray, counters: np.ndarray, states: np.ndarray,
             device: torch.device) -> RowParams:
        """The RowParams of table rows `slots` [N] (counters and request state slots
        [N] int64 given per step); `biased` in `flags` is the caller's to read."""
        floats = np.ascontiguousarray(self.floats[slots].T)
        ints = np.stack((self.ints[slots, 0], self.ints[slots, 1], counters, states))
        flags = self.flags[slots]
        f, i64 = (torch.from_numpy(a).to(device) for a in (floats, ints))
        return RowParams(
            temperature=f[0], top_p=f[1], min_p=f[2], presence=f[3], frequency=f[4],
            repetition=f[5], top_k=i64[0], seed=i64[1], counter=i64[2], state=i64[3],
            bias=None, filtered=bool(flags[:, 0].any()), penalized=bool(flags[:, 1].any()),
            greedy=bool(flags[:, 2].all()))


class SamplingState:
    """What requests keep on the device between steps, by state slot (see the module
    docstring). The runner calls `admit` when a request gets its slot, `rows` per
    step, and `count` with the tokens each row committed."""

    def __init__(self, slots: int, vocab: int, device: torch.device):
        self.slots, self.vocab, self.device = slots, vocab, device
        self.params = ParamTable(slots)          # each slot's owner's parameters
        self.counts: torch.Tensor | None = None
        self.prompt: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def admit(self, state: int, prompt: list[int], output: list[int],
              params: SamplingParams, seed: int) -> None:
        """A request took slot `state`: its parameters and stream, its penalty counts
        and its logit bias row."""
        self.params.write(state, params, seed)
        if params.penalized:
            self._reset_penalties(state, prompt, output)
        if params.logit_bias or self.bias is not None:
            self._set_bias(state, params.logit_bias)

    def rows(self, states: np.ndarray, counters: np.ndarray) -> RowParams:
        """The RowParams of the admitted requests in state slots `states` [N] int64,
        `counters` [N] their output tokens so far."""
        rows = self.params.rows(states, counters, states, self.device)
        return self.biased(rows, bool(self.params.flags[states, 3].any()))

    def biased(self, rows: RowParams, any_bias: bool) -> RowParams:
        """`rows` with their requests' logit bias, when any row has one."""
        if self.bias is None or not any_bias:
            return rows
        return replace(rows, bias=self.bias[rows.state])

    def penalties(self, rows: RowParams) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(output counts [N, V], tokens of prompt or output [N, V]) of the rows, or
        (None, None) when no row is penalized."""
        if not rows.penalized:
            return None, None
        counts = self.counts[rows.state]
        return counts, self.prompt[rows.state] | (counts > 0)

    def count(self, rows: RowParams, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Add the first count[i] tokens of row i (tokens [N, T]) to its output counts."""
        if not rows.penalized:
            return
        keep = torch.arange(tokens.shape[1], device=self.device)[None, :] < count[:, None]
        flat = (rows.state[:, None] * self.vocab + tokens.clamp(min=0)).reshape(-1)
        self.counts.view(-1).index_add_(0, flat, keep.reshape(-1).to(torch.int32))

    def _reset_penalties(self, state: int, prompt: list[int], output: list[int]) -> None:
        if self.counts is None:
            self.counts = self._table(torch.int32)
            self.prompt = self._table(torch.bool)
        self.counts[state] = 0
        self.prompt[state] = False
        self.prompt[state, torch.tensor(prompt, dtype=torch.long).to(self.device)] = True
        if output:
            out = torch.tensor(output, dtype=torch.long).to(self.device)
            self.counts[state].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def _set_bias(self, state: int, bias: tuple[tuple[int, float], ...]) -> None:
        """The dense row of a request's bias (a token given twice: the sum)."""
        if self.bias is None:
            self.bias = self._table(torch.float32)
        self.bias[state] = 0
        if bias:        # numpy reads a full vocabulary's pairs ~10x faster than torch.tensor
            ids = np.fromiter((t for t, _ in bias), np.int64, len(bias))
            values = np.fromiter((v for _, v in bias), np.float32, len(bias))
            self.bias[state].index_put_((torch.from_numpy(ids).to(self.device),),
                                        torch.from_numpy(values).to(self.device),
                                        accumulate=True)

    def _table(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros((self.slots, self.vocab), dtype=dtype, device=self.device)
