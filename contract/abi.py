"""The kernel launch ABI, as data: which kernels a spec has, each one's arguments, and the
pool groups they address. Codegen builds these objects from a spec and writes them out as
generated/<spec>/; the runtime reads them back to stage, check and launch. Torch-free:
dtypes are torch's names ("bfloat16", "int32").

Argument order is: inputs, metadata, pools, weights, scalars, outputs. Every tensor
argument but the weights carries a leading `ranks` dimension: one SPMD launch drives the
ranks a launcher was built for (all of the replica's ranks in one process, or one rank
per worker). A pool is one tensor [ranks, layers, blocks + 1, rows, width] whose last
block is the scratch page: -1 block-table entries and padded rows read and write there.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

# Columns of a rank's int64 MTP slot table [slots + 1, len(MTP_SLOT_FIELDS)].
MTP_SLOT_FIELDS = ("tail_token", "tail_pos", "committed", "generation")

# A decode launch's lightning indexer scores a context bucket's CSA entries (bucket / 4)
# in this many equal tiles: a spec's buckets are multiples of 4 x INDEXER_TILES.
INDEXER_TILES = 8

# A prefill tile's queries attend their window keys in bands of this many rows: a
# query's logits span window - 1 + ATTENTION_BAND keys, not window - 1 + tile.
ATTENTION_BAND = 32

# Symbolic dimensions of an argument's shape, fixed when a launcher is built or launched.
RANKS, BLOCKS, EXTENT = "ranks", "blocks", "extent"


class ABIError(ValueError):
    """An argument does not match the kernel's ABI: name, expected and actual."""


@dataclass(frozen=True)
class Arg:
    """One argument of a kernel.

    role:    input | metadata | pool | weight | scalar | output
    shape:   ints, and RANKS (the ranks a launcher drives), EXTENT (the dynamic prefill
             extent) or BLOCKS (a pool's block count, +1 for the scratch page)
    expr:    the symbolic shape, for messages and docs
    staged:  host data is copied into a buffer the launcher allocates once and reuses
    """

    name: str
    role: str
    dtype: str | None
    shape: tuple[int | str, ...]
    expr: str
    doc: str = ""
    staged: bool = False

    @property
    def source(self) -> str:
        """Where marshalling takes a passed-through tensor from: its keyword, a pool group
        ("pools.<group>") or the MTP state ("mtp.<field>")."""
        if self.role == "pool" and self.name.startswith("pool_"):
            return "pools." + self.name.removeprefix("pool_")
        return {"mtp_slots": "mtp.slots", "mtp_slot_hidden": "mtp.hidden"}.get(self.name,
                                                                              self.name)


@dataclass(frozen=True)
class PoolGroup:
    """One pool group of a spec: a tensor [ranks, layers, blocks + 1, rows_per_page,
    storage_width] of storage_dtype whose last block is the scratch page. A row holds
    row_width values of `dtype` in entry format `format` (contract/entry_formats.py):
    as they are ("compute"), or packed into entry_bytes bytes (uint8).

    Scheduler block b of the group owns page b in every layer of `layers`. A ring group
    holds at most `ring_pages` blocks per request, reused modulo the ring; a full group
    keeps one row per `tokens_per_row` positions, for the whole context.
    """

    name: str
    layers: tuple[int, ...]
    rows_per_page: int
    row_width: int
    dtype: str
    policy: str                        # "ring" | "full"
    tokens_per_row: int                # 1, or the compression ratio of an entry
    ring_pages: int | None
    table_width: int                   # block-table entries per request
    page_bytes: int                    # one layer's page
    block_bytes: int                   # one scheduler block: a page in every layer
    formula: str                       # blocks_for, as the spec's docs write it
    format: str                        # the entry format of a row
    rope_width: int                    # the RoPE part of a row (its last values)
    entry_bytes: int                   # one stored row
    doc: str = ""

    @property
    def packed(self) -> bool:
        return self.format != "compute"

    @property
    def storage_dtype(self) -> str:
        return "uint8" if self.packed else self.dtype

    @property
    def storage_width(self) -> int:
        """A stored row's last dimension: bytes when packed, else values."""
        return self.entry_bytes if self.packed else self.row_width

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a request of `num_tokens` positions holds in this group."""
        if self.ring_pages is not None:
            return min(self.ring_pages, -(-num_tokens // self.rows_per_page))
        return -(-(num_tokens // self.tokens_per_row) // self.rows_per_page)

    def layer_index(self, layer_id: int) -> int:
        """Index of `layer_id` along dim 0 of a rank's group tensor."""
        return self.layers.index(layer_id)


@dataclass(frozen=True, eq=False)
class KernelABI:
    """One fixed kernel specialization: what a launcher stages and checks and what a
    backend needs to dispatch it.

    rows:   request rows per rank (prefill slots, or the decode batch)
    seq:    tokens per decode row (None for prefill)
    k:      speculative tokens of a decode layout (None for prefill)
    ranks, backend: the spec's defaults for a launcher of this kernel

    Compared and hashed by identity: each generated kernel is one object.
    """

    spec: str
    name: str
    kind: str                          # prefill_main | prefill_mtp | decode | decode_mtp
    doc: str
    rows: int
    seq: int | None
    k: int | None
    args: tuple[Arg, ...]
    tile: int
    max_extent: int
    ranks: int
    backend: str
    fingerprint: str = ""
    groups: Mapping[str, PoolGroup] = field(default_factory=dict)
    context_buckets: tuple[int, ...] = ()
    mtp_field: type[enum.IntEnum] | None = None

    @property
    def dynamic_extent(self) -> bool:
        return any(EXTENT in a.shape for a in self.args)

    @property
    def keeps_slots(self) -> bool:
        """A K=0 decode that keeps the MTP slots (its rows write the MTP layer's window)."""
        return self.kind == "decode_mtp" and self.k == 0

    @property
    def class_name(self) -> str:
        """The kernel's CamelCase name (PrefillMain, DecodeB4S2, DecodeB8S1Mtp)."""
        if self.seq is not None:
            return f"DecodeB{self.rows}S{self.seq}" + ("Mtp" if self.keeps_slots else "")
        return "".join(part.title() for part in self.name.split("_"))

    def by_role(self, role: str) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.role == role)

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def context_bucket(self, length: int) -> int:
        """The smallest context bucket holding `length` positions."""
        for bucket in self.context_buckets:
            if length <= bucket:
                return bucket
        raise ABIError(f"{self.name}: a context of {length} positions exceeds the largest "
                       f"bucket {self.context_buckets[-1]}")
