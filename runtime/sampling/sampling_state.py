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
    """RowParams from the rows' SamplingParams: built on the host, two copies to the
    device; no bias rows (SamplingState.row_params adds the requests' own)."""
    floats = np.array([(0.0 if p.greedy else min(p.temperature, F32_MAX), p.top_p, p.min_p,
                        p.presence_penalty, p.frequency_penalty,
                        min(max(p.repetition_penalty, F32_TINY), F32_MAX)) for p in params],
                      np.float32).reshape(-1, 6).T
    ints = np.array([[min(max(p.top_k, 0), TOP_K_CAP) for p in params], seeds, counters,
                     states], np.int64).reshape(4, -1)
    f, i64 = (torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in (floats, ints))
    return RowParams(
        temperature=f[0], top_p=f[1], min_p=f[2], presence=f[3], frequency=f[4],
        repetition=f[5], top_k=i64[0], seed=i64[1], counter=i64[2], state=i64[3], bias=None,
        filtered=any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params),
        penalized=any(p.penalized for p in params),
        greedy=all(p.greedy for p in params))


class SamplingState:
    """What requests keep on the device between steps, by state slot (see the module
    docstring). The runner calls `admit` when a request gets its slot, `row_params` per
    launch, and `count` with the tokens each row committed."""

    def __init__(self, slots: int, vocab: int, device: torch.device):
        self.slots, self.vocab, self.device = slots, vocab, device
        self.counts: torch.Tensor | None = None
        self.prompt: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def admit(self, state: int, prompt: list[int], output: list[int],
              params: SamplingParams) -> None:
        """A request took slot `state`: its penalty counts and its logit bias row."""
        if params.penalized:
            self._reset_penalties(state, prompt, output)
        if params.logit_bias or self.bias is not None:
            self._set_bias(state, params.logit_bias)

    def row_params(self, params: list[SamplingParams], seeds: list[int], counters: list[int],
                   states: list[int]) -> RowParams:
        rows = row_params(params, seeds, counters, states, self.device)
        if self.bias is not None and any(p.logit_bias for p in params):
            rows = replace(rows, bias=self.bias[rows.state])
        return rows

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
