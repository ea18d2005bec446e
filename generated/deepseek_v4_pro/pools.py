# @generated from specs/deepseek-v4-pro.yaml by codegen — do not edit
"""Pool groups of spec `deepseek-v4-pro`.

Group g is one tensor [ranks, layers, blocks + 1, rows_per_page, storage_width] per
device (runtime/device/pools.py allocates it); a row is row_width values in the group's
entry format (stored as they are, or packed into `bytes` uint8: contract/entry_formats.py);
scheduler block b of g owns page b in every layer of g; the last block is the scratch page. Block ids are rank-local and owned by the
scheduler. Ring groups address position p at page (p // rows_per_page) % ring_pages of
the request's ring; full groups keep every compressed entry.

  group            layers  rows/page  row width  dtype     format   bytes  policy  blocks per request
  ori                  62        128        512  bfloat16  fp8_ds     584  ring    min(3, ceil(len / 128))
  cmp_c128             31          1        512  bfloat16  fp8_ds     584  full    ceil((len // 128) / 1)
  cmp_c4               30         32        512  bfloat16  fp8_ds     584  full    ceil((len // 4) / 32)
  idx                  30         32        128  bfloat16  fp4         68  full    ceil((len // 4) / 32)
  hca_state            31          8       1024  float32   compute   4096  ring    min(17, ceil(len / 8))
  csa_state            30          4       2048  float32   compute   8192  ring    min(3, ceil(len / 4))
  csa_inner_state      30          4        512  float32   compute   2048  ring    min(3, ceil(len / 4))
"""
from __future__ import annotations

import enum

from contract.abi import PoolGroup

GROUPS: dict[str, PoolGroup] = {
    "ori": PoolGroup("ori", layers=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
        41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61),
        rows_per_page=128, row_width=512, dtype="bfloat16", policy="ring", tokens_per_row=1,
        ring_pages=3, table_width=3, page_bytes=74752, block_bytes=4634624,
        formula="min(3, ceil(len / 128))", format="fp8_ds", rope_width=64, entry_bytes=584,
        doc="sliding-window KV of every layer, the MTP layer included; ring = ceil((window - 1 "
        "+ in_flight) / block_size) + 1 with window 128, in_flight 4 (the widest decode row)"),
    "cmp_c128": PoolGroup("cmp_c128", layers=(0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
        29, 31, 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59), rows_per_page=1,
        row_width=512, dtype="bfloat16", policy="full", tokens_per_row=128, ring_pages=None,
        table_width=8192, page_bytes=584, block_bytes=18104, formula="ceil((len // 128) / 1)",
        format="fp8_ds", rope_width=64, entry_bytes=584,
        doc="HCA compressed KV entries (ratio 128)"),
    "cmp_c4": PoolGroup("cmp_c4", layers=(2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
        32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60), rows_per_page=32,
        row_width=512, dtype="bfloat16", policy="full", tokens_per_row=4, ring_pages=None,
        table_width=8192, page_bytes=18688, block_bytes=560640, formula="ceil((len // 4) / 32)",
        format="fp8_ds", rope_width=64, entry_bytes=584,
        doc="CSA compressed KV entries (ratio 4)"),
    "idx": PoolGroup("idx", layers=(2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34,
        36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60), rows_per_page=32, row_width=128,
        dtype="bfloat16", policy="full", tokens_per_row=4, ring_pages=None, table_width=8192,
        page_bytes=2176, block_bytes=65280, formula="ceil((len // 4) / 32)", format="fp4",
        rope_width=0, entry_bytes=68, doc="lightning-indexer compressed keys (ratio 4)"),
    "hca_state": PoolGroup("hca_state", layers=(0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
        27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59), rows_per_page=8,
        row_width=1024, dtype="float32", policy="ring", tokens_per_row=1, ring_pages=17,
        table_width=17, page_bytes=32768, block_bytes=1015808, formula="min(17, ceil(len / 8))",
        format="compute", rope_width=0, entry_bytes=4096, doc="C128 compressor state: pending "
        "kv and gate-score rows; ring = ceil((span 128 + in_flight 4 - 2) / rows_per_page 8)"),
    "csa_state": PoolGroup("csa_state", layers=(2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
        30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60), rows_per_page=4,
        row_width=2048, dtype="float32", policy="ring", tokens_per_row=1, ring_pages=3,
        table_width=3, page_bytes=32768, block_bytes=983040, formula="min(3, ceil(len / 4))",
        format="compute", rope_width=0, entry_bytes=8192, doc="C4 compressor state: two "
        "overlapped windows of kv and gate-score rows; ring = ceil((span 8 + in_flight 4 - 2) / "
        "rows_per_page 4)"),
    "csa_inner_state": PoolGroup("csa_inner_state", layers=(2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
        24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60),
        rows_per_page=4, row_width=512, dtype="float32", policy="ring", tokens_per_row=1,
        ring_pages=3, table_width=3, page_bytes=8192, block_bytes=245760,
        formula="min(3, ceil(len / 4))", format="compute", rope_width=0, entry_bytes=2048,
        doc="indexer compressor state: as csa_state at index_head_dim; ring = ceil((span 8 + "
        "in_flight 4 - 2) / rows_per_page 4)"),
}

# Device-state slots per rank: one per running request (its MTP state, its sampling
# state); slot REQUEST_SLOTS_PER_RANK (the last) is scratch for padded rows.
REQUEST_SLOTS_PER_RANK = 64


class MtpField(enum.IntEnum):
    """Columns of the int64 MTP slot table."""

    TAIL_TOKEN = 0
    TAIL_POS = 1
    COMMITTED = 2
    GENERATION = 3
