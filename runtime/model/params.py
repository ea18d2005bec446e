"""Loaded weights: dense tensors by official checkpoint name, routed experts stacked.

Dense tensors are replicated on every rank of the replica (attention is data parallel);
physically one copy per device serves them all. Routed experts are expert parallel:
expert e lives on rank e // experts_per_rank. `experts[layer]` stacks the experts of the
ranks this process holds (every rank in one process), and `rank_experts(layer, rank)`
is one rank's share of them, a view.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.model.args import ModelArgs
from runtime.model.rope import Rope


@dataclass(frozen=True)
class Experts:
    """Routed experts of a layer, stacked: w13 [n, 2 * inter, dim] holds w1's rows then
    w3's (one matmul computes both), w2 [n, dim, inter]. Index i holds global expert
    `first + i`."""

    w13: torch.Tensor
    w2: torch.Tensor
    first: int = 0

    @classmethod
    def of(cls, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> Experts:
        """From separately stacked w1, w3 [n, inter, dim] and w2."""
        return cls(torch.cat((w1, w3), dim=1), w2)

    @property
    def count(self) -> int:
        return self.w13.shape[0]

    @property
    def w1(self) -> torch.Tensor:
        """[n, inter, dim], a view of w13."""
        return self.w13[:, : self.w2.shape[-1]]

    @property
    def w3(self) -> torch.Tensor:
        """[n, inter, dim], a view of w13."""
        return self.w13[:, self.w2.shape[-1]:]

    def slice(self, start: int, count: int) -> Experts:
        """Experts [start, start + count) of this stack (views)."""
        end = start + count
        return Experts(self.w13[start:end], self.w2[start:end], self.first + start)


class LayerParams:
    """The dense tensors of one layer, addressed by name without the layer prefix."""

    def __init__(self, dense: dict[str, torch.Tensor], prefix: str):
        self._dense, self.prefix = dense, prefix

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._dense[self.prefix + name]


@dataclass
class ModelParams:
    args: ModelArgs
    fingerprint: str          # the generated architecture fingerprint these weights match
    dense: dict[str, torch.Tensor]
    experts: dict[int, Experts]    # layer id -> the experts of the ranks held here
    rope: Rope
    dtype: torch.dtype
    device: torch.device
    ranks: int                     # expert-parallel ranks of the replica

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dense[name]

    def layer(self, layer: int) -> LayerParams:
        return LayerParams(self.dense, self.args.prefix(layer))

    @property
    def experts_per_rank(self) -> int:
        return self.args.n_experts // self.ranks

    def rank_experts(self, layer: int, rank: int) -> Experts:
        """The experts `rank` owns in `layer` (it must be held by this process)."""
        per = self.experts_per_rank
        return self.experts[layer].slice(rank * per - self.experts[layer].first, per)
