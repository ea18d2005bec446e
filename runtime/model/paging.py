"""Addressing the grouped pools through scheduler-owned block tables.

Per rank, group g is a tensor [layers, blocks, rows_per_page, stored width]: rows of
row_width values in the group's entry format, quantized on write and dequantized on read
(runtime/model/entry_format.py). A request's block table for g lists its block ids. Row
index i of the request lives at:

    ring group:  page (i // rows_per_page) % ring_pages, row i % rows_per_page
    full group:  page i // rows_per_page,                row i % rows_per_page

where i is a token position (sliding KV, compressor state) or an entry index
(compressed KV, indexer keys). A ring group's table width is its ring size.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from contract.abi import PoolGroup
from runtime.model.entry_format import entry_format


@dataclass(frozen=True)
class Segment:
    """A run of consecutive tokens of one request inside a launch.

    rank/row select the request's block tables ([ranks, rows, width] per group);
    start is the position of its first token; offset its index in the flat batch."""

    rank: int
    row: int
    start: int
    length: int
    offset: int

    @property
    def tokens(self) -> slice:
        return slice(self.offset, self.offset + self.length)

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class PoolView:
    """One launch's pools, block tables and group geometry."""

    pools: Mapping[str, tuple[torch.Tensor, ...]]
    tables: Mapping[str, torch.Tensor]
    groups: Mapping[str, PoolGroup]

    def _address(self, group: str, seg: Segment, index: torch.Tensor):
        table = self.tables[group][seg.rank, seg.row].long()
        rows = self.groups[group].rows_per_page
        page = index // rows
        if self.groups[group].policy == "ring":
            page = page % table.shape[0]
        return table[page], index % rows

    def capacity(self, group: str) -> int:
        """Rows a ring group holds per request: ring pages x rows per page."""
        g = self.groups[group]
        return g.table_width * g.rows_per_page

    def read(self, group: str, seg: Segment, layer: int, index: torch.Tensor) -> torch.Tensor:
        """Rows [len(index), row_width] of `layer` for the request of `seg`."""
        block, row = self._address(group, seg, index)
        layer_index = self.groups[group].layer_index(layer)
        fmt = entry_format(self.groups[group])
        return fmt.decode(self.pools[group][seg.rank][layer_index, block, row]).to(fmt.dtype)

    def write(self, group: str, seg: Segment, layer: int, index: torch.Tensor,
              rows: torch.Tensor) -> None:
        """Store rows [len(index), row_width]; indices must map to distinct slots."""
        block, row = self._address(group, seg, index)
        layer_index = self.groups[group].layer_index(layer)
        pool = self.pools[group][seg.rank]
        pool[layer_index, block, row] = entry_format(self.groups[group]).encode(rows)


def arange(start: int, stop: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, stop, dtype=torch.long, device=device)
