"""One pool group seen through a call's block tables: gathers and masked writes, in
the group's entry format (a packed row is quantized on write, dequantized on read:
runtime/model/entry_format.py).

The group is one tensor [ranks, layers, blocks + 1, rows_per_page, stored width]; index
i of a request (a token position, or an entry index) lives at

    ring group:  page (i // rows_per_page) % ring_pages of its table, row i % rows_per_page
    full group:  page  i // rows_per_page,                           row i % rows_per_page

Every address is computed for every (row, index) pair of a call; pairs that are masked
off, or whose table entry is -1, address the scratch page (block `blocks`). Reads of
masked pairs come back as zeros, so junk on the scratch page never reaches a result.
"""
from __future__ import annotations

import torch

from contract.abi import PoolGroup
from runtime.backends.compiled.rows import Rows
from runtime.model.entry_format import entry_format


class Paged:
    """Group `group` at one layer: `layer` is the layer's index along the group's layer
    dimension (a 0-d tensor, so that every layer of a kind runs the same graph)."""

    def __init__(self, pool: torch.Tensor, group: PoolGroup, layer: torch.Tensor | int):
        self.pool, self.group, self.layer = pool, group, layer
        _, self.layers, self.blocks, self.rows, self.stored = pool.shape
        self.width = group.row_width                   # values a row holds
        self.format = entry_format(group)
        self.scratch = self.blocks - 1

    @property
    def capacity(self) -> int:
        """Indices a ring group holds per request."""
        return self.group.table_width * self.rows

    def address(self, rows: Rows, index: torch.Tensor,
                ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat row numbers [N, M] of indices [N, M] of each row's request, and which of
        them are real (ok, on a page the request holds)."""
        index = index.clamp(min=0)
        page = index // self.rows
        page = page % self.group.table_width if self.group.policy == "ring" \
            else page.clamp(max=self.group.table_width - 1)
        block = rows.tables[self.group.name].gather(1, page)
        real = ok & (block >= 0)
        block = torch.where(real, block, self.scratch)
        layer_row = rows.rank[:, None] * self.layers + self.layer
        return (layer_row * self.blocks + block) * self.rows + index % self.rows, real

    def read(self, rows: Rows, index: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        """Rows [N, M, width] at indices [N, M]; zeros where not real."""
        where, real = self.address(rows, index, ok)
        values = self._decode(read_rows(self.pool, where.reshape(-1)), where.shape)
        if torch.compiler.is_compiling():        # a compiled graph fuses this into its reader
            return torch.where(real[..., None], values, 0)
        return values.masked_fill_(~real[..., None], 0)      # eager: no second copy

    def write(self, rows: Rows, index: torch.Tensor, ok: torch.Tensor,
              values: torch.Tensor) -> None:
        """Store values [N, M, width] at indices [N, M] where ok; masked pairs land on
        the scratch page. Valid pairs must address distinct rows."""
        where = self.address(rows, index, ok)[0].reshape(-1)
        write_rows(self.pool, where, self.format.encode(values.reshape(-1, self.width)))

    def read_then_write(self, rows: Rows, index: torch.Tensor, ok: torch.Tensor,
                        new_index: torch.Tensor, new_ok: torch.Tensor,
                        values: torch.Tensor) -> torch.Tensor:
        """read(index, ok), then write(new_index, new_ok, values), as one access: what is
        read is the pool before the write."""
        where, real = self.address(rows, index, ok)
        new_where = self.address(rows, new_index, new_ok)[0].reshape(-1)
        old = read_then_write_rows(self.pool, where.reshape(-1), new_where,
                                   self.format.encode(values.reshape(-1, self.width)))
        return torch.where(real[..., None], self._decode(old, where.shape), 0)

    def _decode(self, stored: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """Stored rows [M, stored] -> values [*shape, width] in the group's dtype."""
        return self.format.decode(stored).to(self.format.dtype).view(*shape, self.width)


# Pool rows are read and written through opaque ops. Expressed with aten ops on a view
# of the pool, or as a read and an independent write, a later use of the earlier read
# makes the compiler copy the whole pool to keep the read's value; a read that must see
# the pool before a write is one op with that write (read_then_write_rows). The ops are
# defined on the dispatcher directly (not torch.library.custom_op): a graph calls them
# once per pool access, and custom_op's Python wrapper layers cost more than the copy.

_LIB = torch.library.Library("v4serve", "FRAGMENT")
_LIB.define("read_rows(Tensor pool, Tensor where) -> Tensor")
_LIB.define("write_rows(Tensor(a!) pool, Tensor where, Tensor values) -> ()")
_LIB.define("read_then_write_rows(Tensor(a!) pool, Tensor where, Tensor new_where, "
            "Tensor values) -> Tensor")


def _read_rows(pool: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """pool viewed as rows [*, width]: rows `where` [M] -> [M, width]."""
    return pool.view(-1, pool.shape[-1]).index_select(0, where)


def _write_rows(pool: torch.Tensor, where: torch.Tensor, values: torch.Tensor) -> None:
    """pool viewed as rows [*, width]: rows `where` [M] := values [M, width], in place."""
    pool.view(-1, pool.shape[-1]).index_copy_(0, where, values)


def _read_then_write_rows(pool: torch.Tensor, where: torch.Tensor, new_where: torch.Tensor,
                          values: torch.Tensor) -> torch.Tensor:
    """Rows `where` of pool as they were, then rows `new_where` := values."""
    rows = pool.view(-1, pool.shape[-1])
    old = rows.index_select(0, where)
    rows.index_copy_(0, new_where, values)
    return old


for _name, _fn in (("read_rows", _read_rows), ("write_rows", _write_rows),
                   ("read_then_write_rows", _read_then_write_rows)):
    _LIB.impl(_name, _fn, "CompositeExplicitAutograd")


@torch.library.register_fake("v4serve::read_rows")
def _(pool: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return pool.new_empty(where.shape[0], pool.shape[-1])


@torch.library.register_fake("v4serve::write_rows")
def _(pool: torch.Tensor, where: torch.Tensor, values: torch.Tensor) -> None:
    return None


@torch.library.register_fake("v4serve::read_then_write_rows")
def _(pool: torch.Tensor, where: torch.Tensor, new_where: torch.Tensor,
      values: torch.Tensor) -> torch.Tensor:
    return pool.new_empty(where.shape[0], pool.shape[-1])


read_rows = torch.ops.v4serve.read_rows
write_rows = torch.ops.v4serve.write_rows
read_then_write_rows = torch.ops.v4serve.read_then_write_rows
