# @generated from specs/tiny-deep.yaml by codegen — do not edit
"""Pool groups of spec `tiny-deep`.

Group g is one tensor [ranks, layers, blocks + 1, rows_per_page, storage_width] per
device (runtime/device/pools.py allocates it); a row is row_width values in the group's
entry format (stored as they are, or packed into `bytes` uint8: contract/entry_formats.py);
scheduler block b of g owns page b in every layer of g; the last block is the scratch page. Block ids are rank-local and owned by the
scheduler. Ring groups address position p at page (p // rows_per_page) % ring_pages of
the request's ring; full groups keep every compressed entry.

  group            layers  rows/page  row width  dtype     format   bytes  policy  blocks per request
  ori                  17        128        128  float32   compute    512  ring    min(3, ceil(len / 128))
  cmp_c128              5          1        128  float32   compute    512  full    ceil((len // 128) / 1)
  cmp_c4               10         32        128  float32   compute    512  full    ceil((len // 4) / 32)
  idx                  10         32         64  float32   compute    256  full    ceil((len // 4) / 32)
  hca_state             5          8        256  float32   compute   1024  ring    min(17, ceil(len / 8))
  csa_state            10          4        512  float32   compute   2048  ring    min(3, ceil(len / 4))
  csa_inner_state      10          4        256  float32   compute   1024  ring    min(3, ceil(len / 4))
"""
from __future__ import annotations

import enum

from contract.abi import PoolGroup

GROUPS: dict[str, PoolGroup] = {
    "ori": PoolGroup("ori", layers=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
        rows_per_page=128, row_width=128, dtype="float32", policy="ring", tokens_per_row=1,
        ring_pages=3, table_width=3, page_bytes=65536, block_bytes=1114112,
        formula="min(3, ceil(len / 128))", format="compute", rope_width=0, entry_bytes=512,
        doc="sliding-window KV of every layer, the MTP layer included; ring = ceil((window - 1 "
        "+ in_flight) / block_size) + 1 with window 128, in_flight 4 (the widest decode row)"),
    "cmp_c128": PoolGroup("cmp_c128", layers=(2, 5, 8, 11, 14), rows_per_page=1, row_width=128,
        dtype="float32", policy="full", tokens_per_row=128, ring_pages=None, table_width=128,
        page_bytes=512, block_bytes=2560, formula="ceil((len // 128) / 1)", format="compute",
        rope_width=0, entry_bytes=512, doc="HCA compressed KV entries (ratio 128)"),
    "cmp_c4": PoolGroup("cmp_c4", layers=(1, 3, 4, 6, 7, 9, 10, 12, 13, 15), rows_per_page=32,
        row_width=128, dtype="float32", policy="full", tokens_per_row=4, ring_pages=None,
        table_width=128, page_bytes=16384, block_bytes=163840, formula="ceil((len // 4) / 32)",
        format="compute", rope_width=0, entry_bytes=512,
        doc="CSA compressed KV entries (ratio 4)"),
    "idx": PoolGroup("idx", layers=(1, 3, 4, 6, 7, 9, 10, 12, 13, 15), rows_per_page=32,
        row_width=64, dtype="float32", policy="full", tokens_per_row=4, ring_pages=None,
        table_width=128, page_bytes=8192, block_bytes=81920, formula="ceil((len // 4) / 32)",
        format="compute", rope_width=0, entry_bytes=256,
        doc="lightning-indexer compressed keys (ratio 4)"),
    "hca_state": PoolGroup("hca_state", layers=(2, 5, 8, 11, 14), rows_per_page=8, row_width=256,
        dtype="float32", policy="ring", tokens_per_row=1, ring_pages=17, table_width=17,
        page_bytes=8192, block_bytes=40960, formula="min(17, ceil(len / 8))", format="compute",
        rope_width=0, entry_bytes=1024, doc="C128 compressor state: pending kv and gate-score "
        "rows; ring = ceil((span 128 + in_flight 4 - 2) / rows_per_page 8)"),
    "csa_state": PoolGroup("csa_state", layers=(1, 3, 4, 6, 7, 9, 10, 12, 13, 15), rows_per_page=4,
        row_width=512, dtype="float32", policy="ring", tokens_per_row=1, ring_pages=3,
        table_width=3, page_bytes=8192, block_bytes=81920, formula="min(3, ceil(len / 4))",
        format="compute", rope_width=0, entry_bytes=2048, doc="C4 compressor state: two "
        "overlapped windows of kv and gate-score rows; ring = ceil((span 8 + in_flight 4 - 2) / "
        "rows_per_page 4)"),
    "csa_inner_state": PoolGroup("csa_inner_state", layers=(1, 3, 4, 6, 7, 9, 10, 12, 13, 15),
        rows_per_page=4, row_width=256, dtype="float32", policy="ring", tokens_per_row=1,
        ring_pages=3, table_width=3, page_bytes=4096, block_bytes=40960,
        formula="min(3, ceil(len / 4))", format="compute", rope_width=0, entry_bytes=1024,
        doc="indexer compressor state: as csa_state at index_head_dim; ring = ceil((span 8 + "
        "in_flight 4 - 2) / rows_per_page 4)"),
}

# Device-state slots per rank: one per running request (its MTP state, its sampling
# state); slot REQUEST_SLOTS_PER_RANK (the last) is scratch for padded rows.
REQUEST_SLOTS_PER_RANK = 16


class MtpField(enum.IntEnum):
    """Columns of the int64 MTP slot table."""

    TAIL_TOKEN = 0
    TAIL_POS = 1
    COMMITTED = 2
    GENERATION = 3
