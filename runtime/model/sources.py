"""What DeepSeek V4.1's source layers hand the layers above them within one forward.

An index source publishes each segment's top-k; the Reuse layers above it (up to the
next index source) attend with it. The candidate source publishes each segment's kept
candidate blocks; the index sources above it score inside them. Both are transients of
the launch, rebuilt in every forward from the pools (no state crosses launches): the
layers run in order, so a consumer always finds its source's value of this forward.

Compressed KV and index keys are not handed over here: a source writes them to its own
layer's pages and its consumers read those pages (runtime/model/csa2.py).
"""
from __future__ import annotations

import torch


class Sources:
    """Per-launch values of the source layers, by (layer, segment index)."""

    def __init__(self) -> None:
        self._topk: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._blocks: dict[int, torch.Tensor] = {}

    def publish_topk(self, layer: int, segment: int, indices: torch.Tensor,
                     valid: torch.Tensor) -> None:
        """An index source's choice for a segment: entry ids and visibility [n, k]."""
        self._topk[layer, segment] = (indices, valid)

    def topk(self, layer: int, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The choice index source `layer` published for a segment in this launch."""
        if (layer, segment) not in self._topk:
            raise KeyError(f"index source layer {layer} published no top-k for segment "
                           f"{segment} in this launch")
        return self._topk[layer, segment]

    def publish_blocks(self, segment: int, blocks: torch.Tensor) -> None:
        """The candidate source's kept blocks of a segment [n, ceil(entries / block)]."""
        self._blocks[segment] = blocks

    def blocks(self, segment: int) -> torch.Tensor:
        if segment not in self._blocks:
            raise KeyError(f"the candidate source published no blocks for segment {segment} "
                           "in this launch")
        return self._blocks[segment]
