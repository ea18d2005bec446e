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

from contract.model_args import ModelArgs
from runtime.model import quant
from runtime.model.engram import EngramHash, EngramWeights
from runtime.model.rope import Rope


@dataclass(frozen=True)
class Experts:
    """Routed experts of a layer, stacked: w13 [n, 2 * inter, dim] holds w1's rows then
    w3's (one matmul computes both), w2 [n, dim, inter]. Index i holds global expert
    `first + i`. Held as released (runtime/model/quant.py), w13 and w2 are packed FP4
    ([n, 2 * inter, dim / 2], [n, dim, inter / 2]) with their scales beside them."""

    w13: torch.Tensor
    w2: torch.Tensor
    first: int = 0
    w13_scale: torch.Tensor | None = None     # FP4: [n, 2 * inter, dim / 32]
    w2_scale: torch.Tensor | None = None      # FP4: [n, dim, inter / 32]

    @classmethod
    def of(cls, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> Experts:
        """From separately stacked w1, w3 [n, inter, dim] and w2."""
        return cls(torch.cat((w1, w3), dim=1), w2)

    @property
    def count(self) -> int:
        return self.w13.shape[0]

    @property
    def inter(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def quantized(self) -> bool:
        return self.w13_scale is not None

    @property
    def w1(self) -> torch.Tensor:
        """[n, inter, dim], a view of w13 (unquantized experts)."""
        return self.w13[:, : self.inter]

    @property
    def w3(self) -> torch.Tensor:
        """[n, inter, dim], a view of w13 (unquantized experts)."""
        return self.w13[:, self.inter:]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What the device holds: the stacks, and their scales if quantized."""
        return (self.w13, self.w2) + ((self.w13_scale, self.w2_scale) if self.quantized else ())

    def stacks(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13, w2) in `dtype`: dequantized whole if held quantized."""
        return quant.stacks(self.tensors(), dtype)

    def matrices(self, i: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(w1, w2, w3) of local expert i in `dtype`, dequantized if need be."""
        if self.quantized:
            w13 = quant.dequantize(self.w13[i], self.w13_scale[i], dtype)
            w2 = quant.dequantize(self.w2[i], self.w2_scale[i], dtype)
        else:
            w13, w2 = self.w13[i], self.w2[i]
        return w13[: self.inter], w2, w13[self.inter:]

    def slice(self, start: int, count: int) -> Experts:
        """Experts [start, start + count) of this stack (views)."""
        end = start + count
        cut = (lambda t: None if t is None else t[start:end])   # noqa: E731
        return Experts(self.w13[start:end], self.w2[start:end], self.first + start,
                       cut(self.w13_scale), cut(self.w2_scale))


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
    engram: EngramHash | None = None   # V4.1: the token map and hash constants

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dense[name]

    def layer(self, layer: int) -> LayerParams:
        return LayerParams(self.dense, self.args.prefix(layer))

    @property
    def experts_per_rank(self) -> int:
        return self.args.n_experts // self.ranks

    def rank_experts(self, layer: int, rank: int) -> Experts:
        """The experts `rank` owns in `layer` (it must be held by this process); a V4.1
        DSpark stage splits its own expert count."""
        per = self.args.experts(layer) // self.ranks
        return self.experts[layer].slice(rank * per - self.experts[layer].first, per)

    def engram_weights(self, layer: int) -> EngramWeights:
        """V4.1: the Engram tensors of `layer` (one of args.engram_layers), its wkv
        dequantized if held as released (FP8)."""
        p = self.layer(layer)
        gate = p["engram.q_weight"].float() * p["engram.k_weight"].float()
        return EngramWeights(p["engram.embed.weight"], p["engram.embed.scale"],
                             quant.weight(p, "engram.wkv.weight", self.dtype), gate)
