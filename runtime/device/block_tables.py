"""The block tables of every request slot, kept on the device and updated in place.

    table[group]   [ranks, slots + 1, table_width] int32   per request slot (the MTP /
                                                            sampling state slot a running
                                                            request owns on its rank), its
                                                            block ids, -1 past the last;
                                                            slot `slots` (scratch) is all -1

A launch's tables are gathered on the device from its rows' slots ([ranks, rows] ids,
the scratch slot for a row without a request): what crosses from the host per step is
the rows' slot ids and the block ids that are new since the last step, never a whole
table, whatever the context.

What is new is read off the requests themselves: between two admissions a request's
block lists only grow (runtime/core/cache_manager.py), and every admission gives it a new
slot generation. So a slot's row is rewritten whole when a new generation (owner) first
shows up in it, and after that only the tail `blocks[group][written:]` is written.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from contract.abi import PoolGroup
from runtime.core.request import Request
from runtime.device.upload import upload


class BlockTables:
    def __init__(self, groups: Mapping[str, PoolGroup], ranks: int, slots: int,
                 device: torch.device):
        self.ranks, self.device = ranks, device
        self.scratch = slots                   # the slot of rows without a request
        self.table = {g: torch.full((ranks, slots + 1, info.table_width), -1,
                                    dtype=torch.int32, device=device)
                      for g, info in groups.items()}
        self._flat = {g: t.view(-1, t.shape[-1]) for g, t in self.table.items()}
        # (rank, slot) -> (generation, ids written per group, in the request's order)
        self._written: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}

    def update(self, requests: Iterable[Request]) -> None:
        """Bring the scheduled requests' rows up to their block lists: a new owner's row
        is reset and written whole, a known owner's gets the ids it gained (most steps:
        none, one comparison of lengths per row). One transfer per group with new ids."""
        reset: list[tuple[int, int]] = []
        writes: dict[str, list[tuple[int, int, int, list[int]]]] = {}
        for request in requests:
            key = (request.rank, request.slot)
            lengths = tuple(map(len, request.blocks.values()))
            generation, written = self._written.get(key, (None, ()))
            if generation == request.slot_generation and written == lengths:
                continue
            if generation != request.slot_generation:
                reset.append(key)
                written = (0,) * len(lengths)
            for (group, ids), done in zip(request.blocks.items(), written):
                if len(ids) > done:
                    writes.setdefault(group, []).append((*key, done, ids[done:]))
            self._written[key] = (request.slot_generation, lengths)
        if reset:
            self._reset(reset)
        for group, pieces in writes.items():
            self._write(group, pieces)

    def _reset(self, keys: list[tuple[int, int]]) -> None:
        rank, slot = upload(keys, self.device).unbind(1)
        for table in self.table.values():
            table[rank, slot] = -1

    def _write(self, group: str, pieces: list[tuple[int, int, int, list[int]]]) -> None:
        """pieces: (rank, slot, first column, ids); one [4, n] index-and-value upload."""
        n = sum(len(ids) for *_, ids in pieces)
        packed = np.empty((4, n), np.int64)
        at = 0
        for rank, slot, col, ids in pieces:
            end = at + len(ids)
            packed[0, at:end], packed[1, at:end] = rank, slot
            packed[2, at:end] = np.arange(col, col + len(ids))
            packed[3, at:end] = ids
            at = end
        rank, slot, col, ids = upload(packed, self.device).unbind(0)
        self.table[group][rank, slot, col] = ids.to(torch.int32)

    def gather(self, slots: np.ndarray, into: dict[str, torch.Tensor] | None = None
               ) -> dict[str, torch.Tensor]:
        """The launch's tables, `block_table_<group>` [ranks, rows, table_width], for the
        rows' slots [ranks, rows] (the scratch slot where a row has no request). `into`:
        a launcher's staging buffers by argument name; the tables it has are gathered
        straight into them (one op a group, no copy after) and those buffers returned."""
        ranks, rows = slots.shape
        index = upload(self.flat_index(slots).reshape(-1), self.device)
        return self.gather_at(index, ranks, rows, into)

    def flat_index(self, slots: np.ndarray) -> np.ndarray:
        """[ranks * m, rows] slot ids -> their rows in the tables viewed as [ranks *
        (slots + 1), table_width] (the first dimension cycles over the ranks)."""
        ranks = np.arange(slots.shape[0]) % self.ranks
        return slots + ranks[:, None] * (self.scratch + 1)

    def gather_at(self, index: torch.Tensor, ranks: int, rows: int,
                  into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """gather() from the flat index [ranks * rows] already on the device."""
        tables = {}
        for group, table in self._flat.items():
            name = f"block_table_{group}"
            if into is None:
                tables[name] = table.index_select(0, index).view(ranks, rows, -1)
            elif name in into:
                torch.index_select(table, 0, index, out=into[name].view(ranks * rows, -1))
                tables[name] = into[name]
        return tables

    def slots(self, rows: Iterable[tuple[int, int, Request]], width: int) -> np.ndarray:
        """[ranks, width] the slot of each (rank, row, request); scratch elsewhere."""
        slots = np.full((self.ranks, width), self.scratch, np.int64)
        for rank, row, request in rows:
            slots[rank, row] = request.slot
        return slots
