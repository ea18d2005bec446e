"""Scheduler-owned block ids of every pool group on every rank. Torch-free, I/O-free.

A block id of group g on rank r names page id in every layer of g on that rank. The
scheduler asks for all the groups a step needs at once: `can_allocate` then `allocate`
(all or nothing). Freed ids are handed out again later; the runner clears a page
before its new owner uses it.
"""
from __future__ import annotations

from collections.abc import Mapping


class BlockPool:
    def __init__(self, blocks: Mapping[str, int], ranks: int):
        self.capacity = dict(blocks)
        # Per rank and group, a stack of free ids: the most recently freed is reused first.
        self._free = [{g: list(range(n - 1, -1, -1)) for g, n in blocks.items()}
                      for _ in range(ranks)]

    @property
    def ranks(self) -> int:
        return len(self._free)

    def free_count(self, rank: int, group: str) -> int:
        return len(self._free[rank][group])

    def can_allocate(self, rank: int, need: Mapping[str, int]) -> bool:
        return all(self.free_count(rank, g) >= n for g, n in need.items())

    def allocate(self, rank: int, need: Mapping[str, int]) -> dict[str, list[int]]:
        """Take `need[g]` ids of every group g, or raise and take none."""
        if not self.can_allocate(rank, need):
            raise RuntimeError(f"rank {rank} cannot supply {dict(need)}")
        return {g: [self._free[rank][g].pop() for _ in range(n)] for g, n in need.items() if n}

    def free(self, rank: int, blocks: Mapping[str, list[int]]) -> None:
        for g, ids in blocks.items():
            self._free[rank][g].extend(reversed(ids))

    def used(self, rank: int, group: str) -> int:
        return self.capacity[group] - self.free_count(rank, group)

    def usage(self, rank: int) -> float:
        """The fullest group's used fraction on `rank` (what limits admission)."""
        return max(self.used(rank, g) / n for g, n in self.capacity.items() if n)
