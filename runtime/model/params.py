"""Loaded weights: dense tensors by official checkpoint name, routed experts per rank.

Dense tensors are replicated on every rank of the replica (attention is data parallel);
physically one copy per device serves them all. Routed experts are expert parallel:
`experts[layer][rank]` holds only the experts that rank owns, stacked, so expert e
lives on rank e // experts_per_rank at index e % experts_per_rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.model.args import ModelArgs
from runtime.model.rope import Rope


@dataclass(frozen=True)
class Experts:
    """One rank's routed experts of a layer: w1, w3 [local, inter, dim]; w2 [local, dim, inter]."""

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor

    @property
    def count(self) -> int:
        return self.w1.shape[0]


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
    experts: dict[int, tuple[Experts, ...]]   # layer id -> per rank
    rope: Rope
    dtype: torch.dtype
    device: torch.device
    ranks: int = field(init=False)

    def __post_init__(self) -> None:
        self.ranks = len(next(iter(self.experts.values())))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dense[name]

    def layer(self, layer: int) -> LayerParams:
        return LayerParams(self.dense, self.args.prefix(layer))

    @property
    def experts_per_rank(self) -> int:
        return self.args.n_experts // self.ranks
