"""The device tensors of a spec's cache pools and MTP state, allocated from its tables.

Pool group g is one tensor [ranks, layers, blocks + 1, rows_per_page, storage_width] of
its storage dtype (the geometry and entry format generated/<spec>/pools.py declares: a
packed group's rows are bytes); block `blocks` (the last) of every group
is the scratch page: -1 block-table entries and padded rows read and write there, so no
launch needs a branch. The scheduler never hands it out; what it holds is never read as
anyone's data.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, make_dataclass
from functools import cache
from types import ModuleType

import torch

from contract.abi import PoolGroup
from runtime.backends.arg_checks import torch_dtype


@cache
def _pools_type(groups: tuple[str, ...]) -> type:
    """A frozen dataclass with one tensor field per group, in the spec's order."""
    return make_dataclass("Pools", [(g, torch.Tensor) for g in groups], frozen=True)


def allocate_pools(spec: ModuleType, blocks: Mapping[str, int],
                   device: str | torch.device = "cpu", ranks: int | None = None):
    """`blocks[g]` zeroed pages (and the scratch page) of every group g of the spec's
    generated package on each of `ranks` ranks (the spec's RANKS by default)."""
    groups: Mapping[str, PoolGroup] = spec.pools.GROUPS
    missing = sorted(set(groups) - set(blocks))
    if missing:
        raise ValueError(f"no block count for pool groups {missing}")
    ranks = spec.contract.RANKS if ranks is None else ranks
    return _pools_type(tuple(groups))(**{
        g: torch.zeros((ranks, len(grp.layers), blocks[g] + 1, grp.rows_per_page,
                        grp.storage_width), dtype=torch_dtype(grp.storage_dtype),
                       device=device)
        for g, grp in groups.items()})


@dataclass(frozen=True)
class MtpState:
    """MTP device state: `slots` [ranks, slots + 1, len(MtpField)] int64 and `hidden`
    [ranks, slots + 1, hc_mult, hidden], the streams of the row before each slot's tail."""

    slots: torch.Tensor
    hidden: torch.Tensor


def allocate_mtp_state(spec: ModuleType, device: str | torch.device = "cpu",
                       ranks: int | None = None) -> MtpState:
    """Zeroed MTP slots on each of `ranks` ranks, shaped as the spec's fused decode
    kernels take them; generation 0 belongs to no request."""
    fused = next(k for k in spec.kernels.DECODE_BY_K.values() if k.kind == "decode_mtp")
    ranks = spec.contract.RANKS if ranks is None else ranks

    def zeros(name: str) -> torch.Tensor:
        arg = fused.arg(name)
        return torch.zeros((ranks, *arg.shape[1:]), dtype=torch_dtype(arg.dtype),
                           device=device)

    return MtpState(slots=zeros("mtp_slots"), hidden=zeros("mtp_slot_hidden"))
