"""Pool capacity from a memory budget. Torch-free.

Ring groups (sliding KV, compressor state) hold a fixed number of pages per running
request, so they are sized for the most requests a rank runs at once. Every full group
(compressed entries) then gets the same token capacity from what is left.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class Group(Protocol):
    ring_pages: int | None
    rows_per_page: int
    tokens_per_row: int
    block_bytes: int


@dataclass(frozen=True)
class Capacity:
    blocks: dict[str, int]
    tokens: int             # tokens of compressed history a rank holds
    bytes: int


def plan(groups: Mapping[str, Group], budget_bytes: int, max_running: int) -> Capacity:
    """Blocks per group on one rank for `budget_bytes` and `max_running` requests."""
    blocks = {g: grp.ring_pages * max_running for g, grp in groups.items() if grp.ring_pages}
    ring_bytes = sum(groups[g].block_bytes * n for g, n in blocks.items())
    full = {g: grp for g, grp in groups.items() if not grp.ring_pages}
    per_token = sum(grp.block_bytes / (grp.rows_per_page * grp.tokens_per_row)
                    for grp in full.values())
    tokens = int((budget_bytes - ring_bytes) / per_token) if per_token else 0
    if budget_bytes < ring_bytes or (full and tokens < 1):
        raise ValueError(f"a budget of {budget_bytes} bytes per rank cannot hold the "
                         f"{ring_bytes} bytes of ring pages that {max_running} running "
                         "requests need; raise the cache memory or lower max_num_seqs")
    for g, grp in full.items():
        blocks[g] = tokens // (grp.rows_per_page * grp.tokens_per_row)
    used = sum(groups[g].block_bytes * n for g, n in blocks.items())
    return Capacity(blocks, tokens, used)


def bytes_for(groups: Mapping[str, Group], max_running: int, tokens: int) -> int:
    """The budget that holds `max_running` requests and `tokens` of history per rank."""
    ring = sum(grp.ring_pages * max_running * grp.block_bytes
               for grp in groups.values() if grp.ring_pages)
    full = sum(-(-tokens // (grp.rows_per_page * grp.tokens_per_row)) * grp.block_bytes
               for grp in groups.values() if not grp.ring_pages)
    return ring + full
