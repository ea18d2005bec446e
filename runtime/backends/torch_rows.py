"""A launch's rows as the torch backend walks them: its live (rank, row) pairs as
segments of one flat batch, their tokens gathered, and the pools it was handed."""
from __future__ import annotations

import torch

from contract.abi import KernelABI
from runtime.model.paging import PoolView, Segment


def pool_view(kernel: KernelABI, named: dict) -> PoolView:
    """The pools this kernel was handed (prefill_mtp takes only "ori")."""
    groups = [g for g in kernel.groups if "pool_" + g in named]
    return PoolView(pools={g: named["pool_" + g] for g in groups},
                    tables={g: named["block_table_" + g] for g in groups}, groups=kernel.groups)


def segments(lengths: torch.Tensor, starts: torch.Tensor) -> list[Segment]:
    """One segment per (rank, row) with a positive length, in rank-major order."""
    found, offset = [], 0
    for rank, row in torch.nonzero(lengths > 0).tolist():
        n = int(lengths[rank, row])
        found.append(Segment(rank, row, int(starts[rank, row]), n, offset))
        offset += n
    return found


def gather(values: torch.Tensor, segs: list[Segment]) -> torch.Tensor:
    """Rows [rank, row, :length] of every segment, concatenated: [T, ...]."""
    return torch.cat([values[s.rank, s.row, : s.length] for s in segs])


def per_segment(values: torch.Tensor, segs: list[Segment]) -> torch.Tensor:
    """values[rank, row] of every segment, stacked: [S, ...]."""
    return torch.stack([values[s.rank, s.row] for s in segs])
