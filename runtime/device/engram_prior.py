"""The Engram history of a DeepSeek V4.1 launch row: the raw token ids before its first
token, which its Engram n-grams reach back into (runtime/model/engram.py).

No pool keeps them: they are read off the request's known tokens, so a row's history is
the same however the sequence was cut into launches (a chunk boundary, a prefix-cache
hit, a recompute after preemption). Width N - 1 (engram_max_ngram_size - 1), oldest
first, the pad id where the sequence has not started:

    tokens  t0 t1 t2 t3 t4 ...       a row starting at 1 (N = 4):  [pad, pad, t0]
                                     a row starting at 4:          [t1, t2, t3]
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contract.abi import KernelABI
from contract.model_args import ModelArgs
from runtime.core.request import Request

ARG = "engram_prior"


class EngramPrior:
    """`width` raw ids before a position, `pad` before the sequence's start."""

    def __init__(self, width: int, pad: int):
        self.width, self.pad = width, pad

    @classmethod
    def of(cls, kernel: KernelABI, config: Mapping[str, Any]) -> EngramPrior | None:
        """The history `kernel` takes (its engram_prior argument [ranks, rows, width]);
        None for a kernel without one (V4, or V4.1 without Engram layers)."""
        if not any(a.name == ARG for a in kernel.args):
            return None
        return cls(kernel.arg(ARG).shape[-1], ModelArgs.from_config(config).engram_pad_id)

    def ids(self, request: Request, start: int) -> list[int]:
        """The `width` ids before position `start` of `request`: O(width)."""
        before = request.tokens(max(0, start - self.width), start)
        return [self.pad] * (self.width - len(before)) + before

    def rows(self, requests: Sequence[Request], starts: Sequence[int]) -> np.ndarray:
        """[n, width] int64: each request's ids before its start."""
        ids = [self.ids(r, s) for r, s in zip(requests, starts, strict=True)]
        return np.array(ids, np.int64).reshape(len(ids), self.width)

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """[*shape, width] of pad ids: rows without a request."""
        return np.full((*shape, self.width), self.pad, np.int64)
