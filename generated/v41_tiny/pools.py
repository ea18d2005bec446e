# @generated from specs/v41-tiny.yaml by codegen — do not edit
"""Pool groups of spec `v41-tiny`.

Group g is one tensor [ranks, layers, blocks + 1, rows_per_page, storage_width] per
device (runtime/device/pools.py allocates it); a row is row_width values in the group's
entry format (stored as they are, or packed into `bytes` uint8: contract/entry_formats.py);
scheduler block b of g owns page b in every layer of g; the last block is the scratch page. Block ids are rank-local and owned by the
scheduler. Ring groups address position p at page (p // rows_per_page) % ring_pages of
the request's ring; full groups keep every compressed entry.

  group            layers  rows/page  row width  dtype     format   bytes  policy  blocks per request
  ori                  13        128         64  float32   compute    256  ring    min(3, ceil(len / 128))
  cmp_c1                1        128         64  float32   compute    256  full    ceil((len // 1) / 128)
  cmp_c2                2         64         64  float32   compute    256  full    ceil((len // 2) / 64)
  idx_c1                1        128         32  float32   compute    128  full    ceil((len // 1) / 128)
  idx_c2                2         64         32  float32   compute    128  full    ceil((len // 2) / 64)
  state_c2              2          2        128  float32   compute    512  ring    min(2, ceil(len / 2))
"""
from __future__ import annotations

from contract.abi import PoolGroup

GROUPS: dict[str, PoolGroup] = {
    "ori": PoolGroup("ori", layers=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), rows_per_page=128,
        row_width=64, dtype="float32", policy="ring", tokens_per_row=1, ring_pages=3,
        table_width=3, page_bytes=32768, block_bytes=425984, formula="min(3, ceil(len / 128))",
        format="compute", rope_width=0, entry_bytes=256, doc="window KV of every layer; the "
        "DSpark stages' main_kv rows; ring = ceil((window - 1 + in_flight) / block_size) + 1 "
        "with window 128, in_flight 4 (the widest decode row)"),
    "cmp_c1": PoolGroup("cmp_c1", layers=(6,), rows_per_page=128, row_width=64, dtype="float32",
        policy="full", tokens_per_row=1, ring_pages=None, table_width=128, page_bytes=32768,
        block_bytes=32768, formula="ceil((len // 1) / 128)", format="compute", rope_width=0,
        entry_bytes=256, doc="compressed KV of the ratio-1 kv sources"),
    "cmp_c2": PoolGroup("cmp_c2", layers=(2, 4), rows_per_page=64, row_width=64, dtype="float32",
        policy="full", tokens_per_row=2, ring_pages=None, table_width=128, page_bytes=16384,
        block_bytes=32768, formula="ceil((len // 2) / 64)", format="compute", rope_width=0,
        entry_bytes=256, doc="compressed KV of the ratio-2 kv sources"),
    "idx_c1": PoolGroup("idx_c1", layers=(6,), rows_per_page=128, row_width=32, dtype="float32",
        policy="full", tokens_per_row=1, ring_pages=None, table_width=128, page_bytes=16384,
        block_bytes=16384, formula="ceil((len // 1) / 128)", format="compute", rope_width=0,
        entry_bytes=128, doc="index keys of the ratio-1 kv sources"),
    "idx_c2": PoolGroup("idx_c2", layers=(2, 4), rows_per_page=64, row_width=32, dtype="float32",
        policy="full", tokens_per_row=2, ring_pages=None, table_width=128, page_bytes=8192,
        block_bytes=16384, formula="ceil((len // 2) / 64)", format="compute", rope_width=0,
        entry_bytes=128, doc="index keys of the ratio-2 kv sources"),
    "state_c2": PoolGroup("state_c2", layers=(2, 4), rows_per_page=2, row_width=128,
        dtype="float32", policy="ring", tokens_per_row=1, ring_pages=2, table_width=2,
        page_bytes=1024, block_bytes=2048, formula="min(2, ceil(len / 2))", format="compute",
        rope_width=0, entry_bytes=512, doc="ratio-2 compressor state: the open group's kv and "
        "gate-score rows; ring = ceil((span 2 + in_flight 4 - 2) / rows_per_page 2)"),
}

# Device-state slots per rank: one per running request (its MTP state, its sampling
# state); slot REQUEST_SLOTS_PER_RANK (the last) is scratch for padded rows.
REQUEST_SLOTS_PER_RANK = 16
