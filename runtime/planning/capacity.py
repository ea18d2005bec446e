"""Pool capacity from a memory budget. Torch-free.

Ring groups (sliding KV, compressor state) hold a fixed number of pages per running
request, so they are sized for the most requests a rank runs at once. The full groups
(compressed entries) then share what is left so that each holds the same number of
tokens T: the largest T whose pages, ceil(T / tokens per page) per group, fit.

With prefix caching, a ring group whose rows a block boundary needs also keeps pages for
cached blocks (`copies`: group -> tokens of history per page): ceil(T / that) more.
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


def _tokens_per_page(group: Group) -> int:
    return group.rows_per_page * group.tokens_per_row


def _ring_blocks(groups: Mapping[str, Group], max_running: int) -> dict[str, int]:
    return {g: grp.ring_pages * max_running for g, grp in groups.items() if grp.ring_pages}


def _full_blocks(groups: Mapping[str, Group], tokens: int,
                 copies: Mapping[str, int] | None = None) -> dict[str, int]:
    """Pages of T tokens of history: full groups' entries, ring groups' cached copies."""
    full = {g: -(-tokens // _tokens_per_page(grp))
            for g, grp in groups.items() if not grp.ring_pages}
    return full | {g: -(-tokens // block) for g, block in (copies or {}).items()}


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {g: a.get(g, 0) + b.get(g, 0) for g in a.keys() | b.keys()}


def _bytes(groups: Mapping[str, Group], blocks: Mapping[str, int]) -> int:
    return sum(groups[g].block_bytes * n for g, n in blocks.items())


def plan(groups: Mapping[str, Group], budget_bytes: int, max_running: int,
         copies: Mapping[str, int] | None = None) -> Capacity:
    """Blocks per group on one rank for `budget_bytes` and `max_running` requests."""
    ring = _ring_blocks(groups, max_running)
    left = budget_bytes - _bytes(groups, ring)
    if left >= 0 and all(grp.ring_pages for grp in groups.values()):   # no history to size
        return Capacity(ring, 0, _bytes(groups, ring))
    fits = lambda t: _bytes(groups, _full_blocks(groups, t, copies)) <= left  # noqa: E731
    if left < 0:
        raise ValueError(f"a budget of {budget_bytes} bytes per rank cannot hold the "
                         f"{_bytes(groups, ring)} bytes of ring pages that {max_running} running "
                         "requests need; raise the cache memory or lower max_num_seqs")
    if not fits(1):
        raise ValueError(f"a budget of {budget_bytes} bytes per rank leaves no room for one "
                         "page of history per group; raise the cache memory or lower "
                         "max_num_seqs")
    low, high = 1, 2
    while fits(high):                     # grow, then bisect: fits() is monotone in T
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    blocks = _add(ring, _full_blocks(groups, low, copies))
    return Capacity(blocks, low, _bytes(groups, blocks))


def bytes_for(groups: Mapping[str, Group], max_running: int, tokens: int,
              copies: Mapping[str, int] | None = None) -> int:
    """The budget whose plan holds `max_running` requests and `tokens` of history."""
    return _bytes(groups, _add(_ring_blocks(groups, max_running),
                               _full_blocks(groups, tokens, copies)))


def tokens_for(groups: Mapping[str, Group], requests: int, length: int) -> int:
    """History T that gives each of `requests` requests of `length` tokens its own
    pages in every full group (pages are per request, so round up per request)."""
    page = max((-(-length // _tokens_per_page(g)) * _tokens_per_page(g)
                for g in groups.values() if not g.ring_pages), default=0)
    return requests * page
