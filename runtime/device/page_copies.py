"""Whole-page writes to the pools that a step's scheduler output asks for: pages handed
to new owners zeroed, and the prefix cache's page copies (ring pages saved into cache
pages, cached pages restored into rings). A pool group is one tensor
[ranks, layers, blocks + 1, rows, width]; a page is [rank, :, block] (every layer)."""
from __future__ import annotations

import torch

from runtime.core.cache_manager import PageCopy, Save
from runtime.core.scheduler import PrefillChunk
from runtime.device.upload import upload


def copy_pages(pools, copies: list[PageCopy], device: torch.device) -> None:
    """Page dst := page src in every layer of each copy's group; all the reads of a
    group come before its writes."""
    by_group: dict[str, list[PageCopy]] = {}
    for c in copies:
        by_group.setdefault(c.group, []).append(c)
    for group, cs in by_group.items():
        pool = getattr(pools, group)
        rank, src, dst = upload([(c.rank, c.src, c.dst) for c in cs], device).unbind(1)
        pool[rank, :, dst] = pool[rank, :, src]


def clear_pages(pools, fresh: dict[tuple[int, str], list[int]], device: torch.device) -> None:
    """Targeted writes: a page handed to a new owner ((rank, group) -> block ids)
    starts zeroed."""
    for (rank, group), ids in fresh.items():
        getattr(pools, group)[rank, :, upload(ids, device)] = 0


def saved_at(snapshots: list[Save], pieces: list[PrefillChunk]) -> list[PageCopy]:
    """The copies of the saves at boundaries where a piece of this launch ended."""
    ends = {(id(p.request), p.end) for p in pieces}
    return [c for s in snapshots if (id(s.request), s.boundary) in ends for c in s.copies]
