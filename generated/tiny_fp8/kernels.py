# @generated from specs/tiny-fp8.yaml by codegen — do not edit
"""Kernel specializations of spec `tiny-fp8`: each one's launch ABI, in launch order.

A Launcher (runtime/device/launcher.py) stages, checks and launches any of them through
a backend. Shapes name three dimensions fixed at run time: "ranks" (the ranks a launcher
drives), "extent" (the dynamic prefill extent) and "blocks" (a pool's block count; +1 for
the scratch page).
"""
from __future__ import annotations

from contract.abi import Arg, KernelABI

from .architecture import FINGERPRINT
from .contract import BACKEND, CONTEXT_BUCKETS, MAX_EXTENT, RANKS, TILE
from .pools import GROUPS, MtpField


PREFILL_MAIN = KernelABI(
    spec="tiny-fp8", name="prefill_main", kind="prefill_main", rows=4, seq=None, k=None,
    doc="Main-model prefill: up to 4 chunks per rank, each a dynamic extent of at most 8192 rows "
    "walked in 128-row tiles.",
    args=(
        Arg("token_ids", "input", "int64", ("ranks", 4, "extent"), "[ranks, slots, extent]",
            staged=True, doc="chunk tokens per slot, padded to the extent"),
        Arg("start_pos", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="position of each chunk's first token (its cached context length)"),
        Arg("chunk_lens", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="valid tokens per slot; 0 marks an empty slot"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, slots, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 4, 128), "[ranks, slots, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 4, 128), "[ranks, slots, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 4, 128), "[ranks, slots, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 4, 17), "[ranks, slots, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 4, 3), "[ranks, slots, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 4, 3),
            "[ranks, slots, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("extent", "scalar", None, (), "int", doc="padded rows per slot: a tile multiple"),
        Arg("logits", "output", "float32", ("ranks", 4, 4096), "[ranks, slots, vocab]",
            doc="logits of each slot's last valid row"),
        Arg("mtp_hidden", "output", "float32", ("ranks", 4, 128, 4, 256),
            "[ranks, slots, mtp_window, hc_mult, hidden]", doc="pre-hc_head streams of each "
            "slot's last min(mtp_window, chunk_len) rows, row 0 first"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS,
)


PREFILL_MTP = KernelABI(
    spec="tiny-fp8", name="prefill_mtp", kind="prefill_mtp", rows=4, seq=None, k=None, doc="MTP "
    "prefill: rebuilds the MTP layer's sliding KV from the last 128 pre-hc_head rows of a main "
    "prefill and the tokens that follow them.",
    args=(
        Arg("mtp_hidden", "input", "float32", ("ranks", 4, 128, 4, 256),
            "[ranks, slots, mtp_window, hc_mult, hidden]",
            doc="the main prefill's mtp_hidden output"),
        Arg("next_ids", "input", "int64", ("ranks", 4, 128), "[ranks, slots, mtp_window]",
            staged=True, doc="token at position i+1 for each window row i"),
        Arg("start_pos", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="position of window row 0"),
        Arg("num_rows", "metadata", "int32", ("ranks", 4), "[ranks, slots]", staged=True,
            doc="window rows whose next token is known; 0 marks an empty slot"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, slots, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS,
)


DECODE_B8S1 = KernelABI(
    spec="tiny-fp8", name="decode_b8s1", kind="decode", rows=8, seq=1, k=0,
    doc="Decode B8S1: 8 rows of 1 token per rank, no speculation.",
    args=(
        Arg("token_ids", "input", "int64", ("ranks", 8, 1), "[ranks, batch, seq]", staged=True,
            doc="input tokens per row"),
        Arg("positions", "metadata", "int32", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="position of each row's first token"),
        Arg("row_lens", "metadata", "int32", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="tokens per row: 1, or 0 for an empty row"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 8, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 8, 17), "[ranks, batch, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 8, 3), "[ranks, batch, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 8, 3),
            "[ranks, batch, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 8, 1, 4096), "[ranks, batch, seq, vocab]",
            doc="logits of every row token"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS,
)


DECODE_B4S2 = KernelABI(
    spec="tiny-fp8", name="decode_b4s2", kind="decode_mtp", rows=4, seq=2, k=1, doc="Fused "
    "decode + MTP draft B4S2 (K=1): per row, drafts 1 token(s) from the slot's state, then runs "
    "the main model on [tail, drafts].",
    args=(
        Arg("slot_ids", "metadata", "int32", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="MTP state slot of each row; -1 marks an empty row"),
        Arg("slot_gens", "metadata", "int64", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="expected slot generation; a row whose slot moved on is left untouched"),
        Arg("draft_mask", "input", "int32", ("ranks", 4, 128), "[ranks, batch, ceil(vocab / 32)]",
            staged=True, doc="tokens the first draft may take (bit t % 32 of word t // 32): a "
            "constrained row's grammar mask at its tail; all bits set for the others"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 4, 17), "[ranks, batch, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 4, 3),
            "[ranks, batch, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("mtp_slots", "pool", "int64", ("ranks", 17, 4), "[ranks, slots + 1, 4]", doc="per "
            "slot: tail_token, tail_pos, committed, generation; the last slot is scratch"),
        Arg("mtp_slot_hidden", "pool", "float32", ("ranks", 17, 4, 256),
            "[ranks, slots + 1, hc_mult, hidden]",
            doc="per slot: pre-hc_head streams of the row before the tail token"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 4, 2, 4096), "[ranks, batch, seq, vocab]",
            doc="main-model logits of rows [tail, drafts...]"),
        Arg("hidden", "output", "float32", ("ranks", 4, 2, 4, 256),
            "[ranks, batch, seq, hc_mult, hidden]", doc="pre-hc_head streams of every row token"),
        Arg("draft_ids", "output", "int64", ("ranks", 4, 1), "[ranks, batch, k]",
            doc="the MTP drafts this step verified"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS, mtp_field=MtpField,
)


DECODE_B4S3 = KernelABI(
    spec="tiny-fp8", name="decode_b4s3", kind="decode_mtp", rows=4, seq=3, k=2, doc="Fused "
    "decode + MTP draft B4S3 (K=2): per row, drafts 2 token(s) from the slot's state, then runs "
    "the main model on [tail, drafts].",
    args=(
        Arg("slot_ids", "metadata", "int32", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="MTP state slot of each row; -1 marks an empty row"),
        Arg("slot_gens", "metadata", "int64", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="expected slot generation; a row whose slot moved on is left untouched"),
        Arg("draft_mask", "input", "int32", ("ranks", 4, 128), "[ranks, batch, ceil(vocab / 32)]",
            staged=True, doc="tokens the first draft may take (bit t % 32 of word t // 32): a "
            "constrained row's grammar mask at its tail; all bits set for the others"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 4, 17), "[ranks, batch, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 4, 3),
            "[ranks, batch, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("mtp_slots", "pool", "int64", ("ranks", 17, 4), "[ranks, slots + 1, 4]", doc="per "
            "slot: tail_token, tail_pos, committed, generation; the last slot is scratch"),
        Arg("mtp_slot_hidden", "pool", "float32", ("ranks", 17, 4, 256),
            "[ranks, slots + 1, hc_mult, hidden]",
            doc="per slot: pre-hc_head streams of the row before the tail token"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 4, 3, 4096), "[ranks, batch, seq, vocab]",
            doc="main-model logits of rows [tail, drafts...]"),
        Arg("hidden", "output", "float32", ("ranks", 4, 3, 4, 256),
            "[ranks, batch, seq, hc_mult, hidden]", doc="pre-hc_head streams of every row token"),
        Arg("draft_ids", "output", "int64", ("ranks", 4, 2), "[ranks, batch, k]",
            doc="the MTP drafts this step verified"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS, mtp_field=MtpField,
)


DECODE_B4S4 = KernelABI(
    spec="tiny-fp8", name="decode_b4s4", kind="decode_mtp", rows=4, seq=4, k=3, doc="Fused "
    "decode + MTP draft B4S4 (K=3): per row, drafts 3 token(s) from the slot's state, then runs "
    "the main model on [tail, drafts].",
    args=(
        Arg("slot_ids", "metadata", "int32", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="MTP state slot of each row; -1 marks an empty row"),
        Arg("slot_gens", "metadata", "int64", ("ranks", 4), "[ranks, batch]", staged=True,
            doc="expected slot generation; a row whose slot moved on is left untouched"),
        Arg("draft_mask", "input", "int32", ("ranks", 4, 128), "[ranks, batch, ceil(vocab / 32)]",
            staged=True, doc="tokens the first draft may take (bit t % 32 of word t // 32): a "
            "constrained row's grammar mask at its tail; all bits set for the others"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 4, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 4, 17), "[ranks, batch, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 4, 3), "[ranks, batch, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 4, 3),
            "[ranks, batch, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("mtp_slots", "pool", "int64", ("ranks", 17, 4), "[ranks, slots + 1, 4]", doc="per "
            "slot: tail_token, tail_pos, committed, generation; the last slot is scratch"),
        Arg("mtp_slot_hidden", "pool", "float32", ("ranks", 17, 4, 256),
            "[ranks, slots + 1, hc_mult, hidden]",
            doc="per slot: pre-hc_head streams of the row before the tail token"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 4, 4, 4096), "[ranks, batch, seq, vocab]",
            doc="main-model logits of rows [tail, drafts...]"),
        Arg("hidden", "output", "float32", ("ranks", 4, 4, 4, 256),
            "[ranks, batch, seq, hc_mult, hidden]", doc="pre-hc_head streams of every row token"),
        Arg("draft_ids", "output", "int64", ("ranks", 4, 3), "[ranks, batch, k]",
            doc="the MTP drafts this step verified"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS, mtp_field=MtpField,
)


DECODE_B8S1_MTP = KernelABI(
    spec="tiny-fp8", name="decode_b8s1_mtp", kind="decode_mtp", rows=8, seq=1, k=0, doc="Decode "
    "B8S1 keeping the MTP slots (K=0 of a policy that drafts on other steps): per row, the MTP "
    "layer's KV of the row before the tail from the slot's state, then the main model on [tail]; "
    "no drafts.",
    args=(
        Arg("slot_ids", "metadata", "int32", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="MTP state slot of each row; -1 marks an empty row"),
        Arg("slot_gens", "metadata", "int64", ("ranks", 8), "[ranks, batch]", staged=True,
            doc="expected slot generation; a row whose slot moved on is left untouched"),
        Arg("draft_mask", "input", "int32", ("ranks", 8, 128), "[ranks, batch, ceil(vocab / 32)]",
            staged=True, doc="tokens the first draft may take (bit t % 32 of word t // 32): a "
            "constrained row's grammar mask at its tail; all bits set for the others"),
        Arg("block_table_ori", "metadata", "int32", ("ranks", 8, 3), "[ranks, batch, 3]",
            staged=True,
            doc="rank-local ori block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_cmp_c128", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True, doc="rank-local cmp_c128 block ids per row; -1 (the scratch page) past "
            "the last block"),
        Arg("block_table_cmp_c4", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_idx", "metadata", "int32", ("ranks", 8, 128), "[ranks, batch, 128]",
            staged=True,
            doc="rank-local idx block ids per row; -1 (the scratch page) past the last block"),
        Arg("block_table_hca_state", "metadata", "int32", ("ranks", 8, 17), "[ranks, batch, 17]",
            staged=True, doc="rank-local hca_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_state", "metadata", "int32", ("ranks", 8, 3), "[ranks, batch, 3]",
            staged=True, doc="rank-local csa_state block ids per row; -1 (the scratch page) "
            "past the last block"),
        Arg("block_table_csa_inner_state", "metadata", "int32", ("ranks", 8, 3),
            "[ranks, batch, 3]", staged=True, doc="rank-local csa_inner_state block ids per "
            "row; -1 (the scratch page) past the last block"),
        Arg("pool_ori", "pool", "uint8", ("ranks", 5, "blocks", 128, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="sliding-window KV of every layer, the MTP layer included"),
        Arg("pool_cmp_c128", "pool", "uint8", ("ranks", 1, "blocks", 1, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="HCA compressed KV entries (ratio 128)"),
        Arg("pool_cmp_c4", "pool", "uint8", ("ranks", 2, "blocks", 32, 200),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="CSA compressed KV entries (ratio 4)"),
        Arg("pool_idx", "pool", "uint8", ("ranks", 2, "blocks", 32, 34),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="lightning-indexer compressed keys (ratio 4)"),
        Arg("pool_hca_state", "pool", "float32", ("ranks", 1, "blocks", 8, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C128 compressor state: pending kv and gate-score rows"),
        Arg("pool_csa_state", "pool", "float32", ("ranks", 2, "blocks", 4, 512),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="C4 compressor state: two overlapped windows of kv and gate-score rows"),
        Arg("pool_csa_inner_state", "pool", "float32", ("ranks", 2, "blocks", 4, 256),
            "[ranks, layers, blocks + 1, rows, width]",
            doc="indexer compressor state: as csa_state at index_head_dim"),
        Arg("mtp_slots", "pool", "int64", ("ranks", 17, 4), "[ranks, slots + 1, 4]", doc="per "
            "slot: tail_token, tail_pos, committed, generation; the last slot is scratch"),
        Arg("mtp_slot_hidden", "pool", "float32", ("ranks", 17, 4, 256),
            "[ranks, slots + 1, hc_mult, hidden]",
            doc="per slot: pre-hc_head streams of the row before the tail token"),
        Arg("weights", "weight", None, (), "handle",
            doc="loaded model weights; their fingerprint must match this spec's model"),
        Arg("context", "scalar", None, (), "int", doc="positions the longest row reaches (its "
            "position + seq): the decode graph of the smallest context bucket holding it serves "
            "the launch"),
        Arg("logits", "output", "float32", ("ranks", 8, 1, 4096), "[ranks, batch, seq, vocab]",
            doc="main-model logits of rows [tail, drafts...]"),
        Arg("hidden", "output", "float32", ("ranks", 8, 1, 4, 256),
            "[ranks, batch, seq, hc_mult, hidden]", doc="pre-hc_head streams of every row token"),
        Arg("draft_ids", "output", "int64", ("ranks", 8, 0), "[ranks, batch, k]",
            doc="the MTP drafts this step verified"),
    ),
    tile=TILE, max_extent=MAX_EXTENT, ranks=RANKS, backend=BACKEND, fingerprint=FINGERPRINT,
    groups=GROUPS, context_buckets=CONTEXT_BUCKETS, mtp_field=MtpField,
)

KERNELS = {
    "prefill_main": PREFILL_MAIN,
    "prefill_mtp": PREFILL_MTP,
    "decode_b8s1": DECODE_B8S1,
    "decode_b4s2": DECODE_B4S2,
    "decode_b4s3": DECODE_B4S3,
    "decode_b4s4": DECODE_B4S4,
    "decode_b8s1_mtp": DECODE_B8S1_MTP,
}

# The decode kernel serving each K (speculative tokens per step).
DECODE_BY_K = {
    0: DECODE_B8S1,
    1: DECODE_B4S2,
    2: DECODE_B4S3,
    3: DECODE_B4S4,
}

# The same with the MTP slots kept at every K (a policy that chooses K per step): K=0
# writes the MTP layer's window and advances the slots too.
DECODE_KEEPING_SLOTS_BY_K = {
    0: DECODE_B8S1_MTP,
    1: DECODE_B4S2,
    2: DECODE_B4S3,
    3: DECODE_B4S4,
}
