"""MTP device-state slots of every rank, with reuse generations. Torch-free.

A running request with MTP owns one slot on its rank from admission to its end. Every
acquisition bumps the slot's generation, so a step queued for an earlier owner (after
a preemption or reuse) carries a generation that no longer matches and is ignored.
Generation 0 belongs to no request.
"""
from __future__ import annotations


class SlotTable:
    def __init__(self, ranks: int, slots_per_rank: int):
        self.slots_per_rank = slots_per_rank
        self._free = [list(range(slots_per_rank - 1, -1, -1)) for _ in range(ranks)]
        self._generation = [[0] * slots_per_rank for _ in range(ranks)]

    def can_acquire(self, rank: int) -> bool:
        return bool(self._free[rank])

    def acquire(self, rank: int) -> tuple[int, int]:
        """(slot, generation) for a new owner on `rank`."""
        if not self._free[rank]:
            raise RuntimeError(f"rank {rank} has no free MTP slot")
        slot = self._free[rank].pop()
        self._generation[rank][slot] += 1
        return slot, self._generation[rank][slot]

    def release(self, rank: int, slot: int) -> None:
        self._free[rank].append(slot)

    def generation(self, rank: int, slot: int) -> int:
        return self._generation[rank][slot]

    def in_use(self, rank: int) -> int:
        return self.slots_per_rank - len(self._free[rank])
