# @generated from specs/deepseek-v41-flash.yaml by codegen — do not edit
"""Pool groups of spec `deepseek-v41-flash`.

Group g is one tensor [ranks, layers, blocks + 1, rows_per_page, storage_width] per
device (runtime/device/pools.py allocates it); a row is row_width values in the group's
entry format (stored as they are, or packed into `bytes` uint8: contract/entry_formats.py);
scheduler block b of g owns page b in every layer of g; the last block is the scratch page. Block ids are rank-local and owned by the
scheduler. Ring groups address position p at page (p // rows_per_page) % ring_pages of
the request's ring; full groups keep every compressed entry.

  group            layers  rows/page  row width  dtype     format   bytes  policy  blocks per request
  ori                  43        128        512  bfloat16  fp8_32     528  ring    min(3, ceil(len / 128))
  cmp_c1                1        128        512  bfloat16  fp4_16     288  full    ceil((len // 1) / 128)
  cmp_c2                3         64        512  bfloat16  fp4_16     288  full    ceil((len // 2) / 64)
  idx_c1                1        128        128  bfloat16  fp4_32      68  full    ceil((len // 1) / 128)
  idx_c2                3         64        128  bfloat16  fp4_32      68  full    ceil((len // 2) / 64)
  state_c2              3          2       1024  float32   compute   4096  ring    min(2, ceil(len / 2))
"""
from __future__ import annotations

from contract.abi import PoolGroup

GROUPS: dict[str, PoolGroup] = {
    "ori": PoolGroup("ori", layers=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
        41, 42), rows_per_page=128, row_width=512, dtype="bfloat16", policy="ring",
        tokens_per_row=1, ring_pages=3, table_width=3, page_bytes=67584, block_bytes=2906112,
        formula="min(3, ceil(len / 128))", format="fp8_32", rope_width=0, entry_bytes=528,
        doc="window KV of every layer; the DSpark stages' main_kv rows; ring = ceil((window - 1 "
        "+ in_flight) / block_size) + 1 with window 128, in_flight 4 (the widest decode row)"),
    "cmp_c1": PoolGroup("cmp_c1", layers=(20,), rows_per_page=128, row_width=512, dtype="bfloat16",
        policy="full", tokens_per_row=1, ring_pages=None, table_width=8192, page_bytes=36864,
        block_bytes=36864, formula="ceil((len // 1) / 128)", format="fp4_16", rope_width=0,
        entry_bytes=288, doc="compressed KV of the ratio-1 kv sources"),
    "cmp_c2": PoolGroup("cmp_c2", layers=(2, 8, 14), rows_per_page=64, row_width=512,
        dtype="bfloat16", policy="full", tokens_per_row=2, ring_pages=None, table_width=8192,
        page_bytes=18432, block_bytes=55296, formula="ceil((len // 2) / 64)", format="fp4_16",
        rope_width=0, entry_bytes=288, doc="compressed KV of the ratio-2 kv sources"),
    "idx_c1": PoolGroup("idx_c1", layers=(20,), rows_per_page=128, row_width=128, dtype="bfloat16",
        policy="full", tokens_per_row=1, ring_pages=None, table_width=8192, page_bytes=8704,
        block_bytes=8704, formula="ceil((len // 1) / 128)", format="fp4_32", rope_width=0,
        entry_bytes=68, doc="index keys of the ratio-1 kv sources"),
    "idx_c2": PoolGroup("idx_c2", layers=(2, 8, 14), rows_per_page=64, row_width=128,
        dtype="bfloat16", policy="full", tokens_per_row=2, ring_pages=None, table_width=8192,
        page_bytes=4352, block_bytes=13056, formula="ceil((len // 2) / 64)", format="fp4_32",
        rope_width=0, entry_bytes=68, doc="index keys of the ratio-2 kv sources"),
    "state_c2": PoolGroup("state_c2", layers=(2, 8, 14), rows_per_page=2, row_width=1024,
        dtype="float32", policy="ring", tokens_per_row=1, ring_pages=2, table_width=2,
        page_bytes=8192, block_bytes=24576, formula="min(2, ceil(len / 2))", format="compute",
        rope_width=0, entry_bytes=4096, doc="ratio-2 compressor state: the open group's kv and "
        "gate-score rows; ring = ceil((span 2 + in_flight 4 - 2) / rows_per_page 2)"),
}

# Device-state slots per rank: one per running request (its MTP state, its sampling
# state); slot REQUEST_SLOTS_PER_RANK (the last) is scratch for padded rows.
REQUEST_SLOTS_PER_RANK = 64
