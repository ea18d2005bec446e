# @generated from specs/tiny.yaml by codegen — do not edit
"""Pool groups of spec `tiny` and the allocator of their stacked tensors.

Group g is one tensor [ranks, layers, blocks + 1, rows_per_page, row_width]; scheduler
block b of g owns page b in every layer of g; the last block is the scratch page. Block ids are rank-local and owned by the
scheduler. Ring groups address position p at page (p // rows_per_page) % ring_pages of
the request's ring; full groups keep every compressed entry.

  group            layers  rows/page  row width  dtype     policy  blocks per request
  ori                   5        128        128  float32   ring    min(3, ceil(len / 128))
  cmp_c128              1          1        128  float32   full    ceil((len // 128) / 1)
  cmp_c4                2         32        128  float32   full    ceil((len // 4) / 32)
  idx                   2         32         64  float32   full    ceil((len // 4) / 32)
  hca_state             1          8        256  float32   ring    min(16, ceil(len / 8))
  csa_state             2          4        512  float32   ring    min(2, ceil(len / 4))
  csa_inner_state       2          4        256  float32   ring    min(2, ceil(len / 4))
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from runtime.device.abi import PoolGroup

RANKS = 8


def ori_blocks(num_tokens: int) -> int:
    """ori: min(3, ceil(len / 128)); ring = ceil((window - 1 + in_flight) / block_size) + 1 with
    window 128, in_flight 2 (the widest decode row)."""
    return min(3, -(-num_tokens // 128))


def cmp_c128_blocks(num_tokens: int) -> int:
    """cmp_c128: ceil((len // 128) / 1)."""
    return -(-(num_tokens // 128) // 1)


def cmp_c4_blocks(num_tokens: int) -> int:
    """cmp_c4: ceil((len // 4) / 32)."""
    return -(-(num_tokens // 4) // 32)


def idx_blocks(num_tokens: int) -> int:
    """idx: ceil((len // 4) / 32)."""
    return -(-(num_tokens // 4) // 32)


def hca_state_blocks(num_tokens: int) -> int:
    """hca_state: min(16, ceil(len / 8)); ring = state span 128 / rows_per_page 8."""
    return min(16, -(-num_tokens // 8))


def csa_state_blocks(num_tokens: int) -> int:
    """csa_state: min(2, ceil(len / 4)); ring = state span 8 / rows_per_page 4."""
    return min(2, -(-num_tokens // 4))


def csa_inner_state_blocks(num_tokens: int) -> int:
    """csa_inner_state: min(2, ceil(len / 4)); ring = state span 8 / rows_per_page 4."""
    return min(2, -(-num_tokens // 4))


GROUPS: dict[str, PoolGroup] = {
    # sliding-window KV of every layer, the MTP layer included
    "ori": PoolGroup(
        name="ori",
        layers=(0, 1, 2, 3, 4),
        rows_per_page=128,
        row_width=128,
        dtype=torch.float32,
        policy="ring",
        tokens_per_row=1,
        ring_pages=3,
        table_width=3,
        page_bytes=65536,
        block_bytes=327680,
        blocks_for=ori_blocks,
        formula="min(3, ceil(len / 128))",
    ),
    # HCA compressed KV entries (ratio 128)
    "cmp_c128": PoolGroup(
        name="cmp_c128",
        layers=(2,),
        rows_per_page=1,
        row_width=128,
        dtype=torch.float32,
        policy="full",
        tokens_per_row=128,
        ring_pages=None,
        table_width=128,
        page_bytes=512,
        block_bytes=512,
        blocks_for=cmp_c128_blocks,
        formula="ceil((len // 128) / 1)",
    ),
    # CSA compressed KV entries (ratio 4)
    "cmp_c4": PoolGroup(
        name="cmp_c4",
        layers=(1, 3),
        rows_per_page=32,
        row_width=128,
        dtype=torch.float32,
        policy="full",
        tokens_per_row=4,
        ring_pages=None,
        table_width=128,
        page_bytes=16384,
        block_bytes=32768,
        blocks_for=cmp_c4_blocks,
        formula="ceil((len // 4) / 32)",
    ),
    # lightning-indexer compressed keys (ratio 4)
    "idx": PoolGroup(
        name="idx",
        layers=(1, 3),
        rows_per_page=32,
        row_width=64,
        dtype=torch.float32,
        policy="full",
        tokens_per_row=4,
        ring_pages=None,
        table_width=128,
        page_bytes=8192,
        block_bytes=16384,
        blocks_for=idx_blocks,
        formula="ceil((len // 4) / 32)",
    ),
    # C128 compressor state: pending kv and gate-score rows
    "hca_state": PoolGroup(
        name="hca_state",
        layers=(2,),
        rows_per_page=8,
        row_width=256,
        dtype=torch.float32,
        policy="ring",
        tokens_per_row=1,
        ring_pages=16,
        table_width=16,
        page_bytes=8192,
        block_bytes=8192,
        blocks_for=hca_state_blocks,
        formula="min(16, ceil(len / 8))",
    ),
    # C4 compressor state: two overlapped windows of kv and gate-score rows
    "csa_state": PoolGroup(
        name="csa_state",
        layers=(1, 3),
        rows_per_page=4,
        row_width=512,
        dtype=torch.float32,
        policy="ring",
        tokens_per_row=1,
        ring_pages=2,
        table_width=2,
        page_bytes=8192,
        block_bytes=16384,
        blocks_for=csa_state_blocks,
        formula="min(2, ceil(len / 4))",
    ),
    # indexer compressor state: as csa_state at index_head_dim
    "csa_inner_state": PoolGroup(
        name="csa_inner_state",
        layers=(1, 3),
        rows_per_page=4,
        row_width=256,
        dtype=torch.float32,
        policy="ring",
        tokens_per_row=1,
        ring_pages=2,
        table_width=2,
        page_bytes=4096,
        block_bytes=8192,
        blocks_for=csa_inner_state_blocks,
        formula="min(2, ceil(len / 4))",
    ),
}


@dataclass(frozen=True)
class Pools:
    """Every group as one tensor [ranks, layers, blocks + 1, rows_per_page, row_width].

    Block `blocks` (the last) of every group is the scratch page: -1 block-table
    entries and padded rows read and write there, so no launch needs a branch. The
    scheduler never hands it out; what it holds is never read as anyone's data.
    """

    ori: torch.Tensor
    cmp_c128: torch.Tensor
    cmp_c4: torch.Tensor
    idx: torch.Tensor
    hca_state: torch.Tensor
    csa_state: torch.Tensor
    csa_inner_state: torch.Tensor


def allocate(blocks: dict[str, int], device: str | torch.device = "cpu",
             ranks: int = RANKS) -> Pools:
    """Allocate `blocks[g]` zeroed pages (and the scratch page) of every group g on each of
    `ranks` ranks."""
    missing = sorted(set(GROUPS) - set(blocks))
    if missing:
        raise ValueError(f"no block count for pool groups {missing}")
    return Pools(
        ori=torch.zeros(
            (ranks, 5, blocks["ori"] + 1, 128, 128), dtype=torch.float32, device=device,
        ),
        cmp_c128=torch.zeros(
            (ranks, 1, blocks["cmp_c128"] + 1, 1, 128), dtype=torch.float32, device=device,
        ),
        cmp_c4=torch.zeros(
            (ranks, 2, blocks["cmp_c4"] + 1, 32, 128), dtype=torch.float32, device=device,
        ),
        idx=torch.zeros((ranks, 2, blocks["idx"] + 1, 32, 64), dtype=torch.float32, device=device),
        hca_state=torch.zeros(
            (ranks, 1, blocks["hca_state"] + 1, 8, 256), dtype=torch.float32, device=device,
        ),
        csa_state=torch.zeros(
            (ranks, 2, blocks["csa_state"] + 1, 4, 512), dtype=torch.float32, device=device,
        ),
        csa_inner_state=torch.zeros(
            (ranks, 2, blocks["csa_inner_state"] + 1, 4, 256), dtype=torch.float32, device=device,
        ),
    )


def bytes_per_rank(blocks: dict[str, int]) -> int:
    """Bytes one rank's pools take for these block counts (the scratch page aside)."""
    return sum(GROUPS[g].block_bytes * n for g, n in blocks.items())


# Device-state slots per rank: one per running request (its MTP state, its sampling
# state); slot REQUEST_SLOTS_PER_RANK (the last) is scratch for padded rows.
REQUEST_SLOTS_PER_RANK = 16


class MtpField(enum.IntEnum):
    """Columns of the int64 MTP slot table."""

    TAIL_TOKEN = 0
    TAIL_POS = 1
    COMMITTED = 2
    GENERATION = 3


@dataclass(frozen=True)
class MtpState:
    """MTP device state: `slots` [ranks, slots + 1, len(MtpField)] int64 and `hidden`
    [ranks, slots + 1, hc_mult, hidden], the streams of the row before each slot's tail."""

    slots: torch.Tensor
    hidden: torch.Tensor


def allocate_mtp_state(device: str | torch.device = "cpu", ranks: int = RANKS) -> MtpState:
    """Zeroed MTP slots on each of `ranks` ranks; generation 0 belongs to no request."""
    return MtpState(
        slots=torch.zeros((ranks, 17, len(MtpField)), dtype=torch.int64, device=device),
        hidden=torch.zeros((ranks, 17, 4, 256), dtype=torch.float32, device=device),
    )
