# @generated from specs/deepseek-v41-flash.yaml by codegen — do not edit
"""Kernel specializations of spec `deepseek-v41-flash`: each one's launch ABI, in launch order.

A Launcher (runtime/device/launcher.py) stages, checks and launches any of them through
a backend. Shapes name three dimensions fixed at run time: "ranks" (the ranks a launcher
drives), "extent" (the dynamic prefill extent) and "blocks" (a pool's block count; +1 for
the scratch page).
"""
from __future__ import annotations

from contract.abi import Arg, KernelABI

from .architecture import FINGERPRINT
from .contract import BACKEND, CONTEXT_BUCKETS, MAX_EXTENT, RANKS, TILE
from .pools import GROUPS


PREFILL_MAIN = KernelABI(
    spec="deepseek-v41-flash", name="prefill_main", kind="prefill_main", rows=4, seq=None, k=None,
    doc="Main-model prefill: up to 4 chunks per rank, each a dynamic extent of at most 8192 rows "
    "walked in 128-row tiles.",
    args=(
        Arg("token_ids", "input", "int64", ("ranks", 4, "extent"), "[ranks, slots, extent]",
            staged=True, doc="chunk tokens per slot, padded to the extent"),
        Arg("engram_prior", "input", "int64", ("ranks", 4, 3),
            "[ranks, slots, engram_max_ngram_size - 1]", staged=True, doc="the raw token ids "
            "before each row's first token, oldest first; engram_pad_token_id before the "
            "sequence starts (its Engram n-grams reach back into them)"),
        Arg("start_pos", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="position of each chunk's first token (its cached context length)"),
        Arg("chunk_lens", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="valid tokens per slot; 0 marks an empty slot"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, slots, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c1", "metadata", "int32", ("ranks", 4, 8192), "[ranks, slots, 8192]",
            staged=True,
            doc="rank-local cmp_c1 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c2", "metadata", "int32", ("ranks", 4, 8192), "[ranks, slots, 8192]",
            staged=True,
            doc="rank-local cmp_c2 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx_c1", "metadata", "int32", ("ranks", 4, 8192), "[ranks, slots, 8192]",
            staged=True,
            doc="rank-local idx_c1 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx_c2", "metadata", "int32", ("ranks", 4, 8192), "[ranks, slots, 8192]",
            staged=True,
            doc="rank-local idx_c2 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_state_c2", "metadata", "int32", ("ranks", 4, 2), "[ranks, slots, 2]",
            staged=True, doc="rank-local state_c2 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 43, "blocks", 128, 528),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="window KV of every layer; the DSpark stages' main_kv rows"),
        Arg("pool_cmp_c1", "pool", "uint8", ("ranks", 1, "blocks", 128, 288),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="compressed KV of the ratio-1 kv sources"),
        Arg("pool_cmp_c2", "pool", "uint8", ("ranks", 3, "blocks", 64, 288),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="compressed KV of the ratio-2 kv sources"),
        Arg("pool_idx_c1", "pool", "uint8", ("ranks", 1, "blocks", 128, 68),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="index keys of the ratio-1 kv sources"),
        Arg("pool_idx_c2", "pool", "uint8", ("ranks", 3, "blocks", 64, 68),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="index keys of the ratio-2 kv sources"),
        Arg("pool_state_c2", "pool", "float32", ("ranks", 3, "blocks", 2, 1024),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="ratio-2 compressor state: the open group's kv and gate-score rows"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("extent", "scalar", None, (), "int", doc="padded rows per slot: a tile multiple"),
        Arg("logits", "output", "float32", ("ranks", 4, 129280), "[ranks, slots, vocab]",
            doc="logits of each slot's last valid row"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS,
)


DECODE_B8S1 = KernelABI(
    spec="deepseek-v41-flash", name="decode_b8s1", kind="decode", rows=8, seq=1, k=0,
    doc="Decode B8S1: 8 rows of 1 token per rank, no speculation.",
    args=(
        Arg("token_ids", "input", "int64", ("ranks", 8, 1), "[ranks, batch, seq]", staged=True,
            doc="input tokens per row"),
        Arg("engram_prior", "input", "int64", ("ranks", 8, 3),
            "[ranks, batch, engram_max_ngram_size - 1]", staged=True, doc="the raw token ids "
            "before each row's first token, oldest first; engram_pad_token_id before the "
            "sequence starts (its Engram n-grams reach back into them)"),
        Arg("positions", "metadata", "int32", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="position of each row's first token"),
        Arg("row_lens", "metadata", "int32", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="tokens per row: 1, or 0 for an empty row"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 8, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c1", "metadata", "int32", ("ranks", 8, 8192), "[ranks, batch, 8192]",
            staged=True,
            doc="rank-local cmp_c1 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c2", "metadata", "int32", ("ranks", 8, 8192), "[ranks, batch, 8192]",
            staged=True,
            doc="rank-local cmp_c2 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx_c1", "metadata", "int32", ("ranks", 8, 8192), "[ranks, batch, 8192]",
            staged=True,
            doc="rank-local idx_c1 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx_c2", "metadata", "int32", ("ranks", 8, 8192), "[ranks, batch, 8192]",
            staged=True,
            doc="rank-local idx_c2 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_state_c2", "metadata", "int32", ("ranks", 8, 2), "[ranks, batch, 2]",
            staged=True, doc="rank-local state_c2 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 43, "blocks", 128, 528),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="window KV of every layer; the DSpark stages' main_kv rows"),
        Arg("pool_cmp_c1", "pool", "uint8", ("ranks", 1, "blocks", 128, 288),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="compressed KV of the ratio-1 kv sources"),
        Arg("pool_cmp_c2", "pool", "uint8", ("ranks", 3, "blocks", 64, 288),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="compressed KV of the ratio-2 kv sources"),
        Arg("pool_idx_c1", "pool", "uint8", ("ranks", 1, "blocks", 128, 68),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="index keys of the ratio-1 kv sources"),
        Arg("pool_idx_c2", "pool", "uint8", ("ranks", 3, "blocks", 64, 68),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="index keys of the ratio-2 kv sources"),
        Arg("pool_state_c2", "pool", "float32", ("ranks", 3, "blocks", 2, 1024),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="ratio-2 compressor state: the open group's kv and gate-score rows"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 8, 1, 129280), "[ranks, batch, seq, vocab]",
            doc="logits of every row token"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS,
)

KERNELS = {
    "prefill_main": PREFILL_MAIN,
    "decode_b8s1": DECODE_B8S1,
}

# The decode kernel serving each K (speculative tokens per step).
DECODE_BY_K = {
    0: DECODE_B8S1,
}
