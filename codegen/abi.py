"""Which kernels a spec has and each one's arguments, built from its plan as the
contract's KernelABI objects (contract/abi.py says what an argument's role, dtype and
shape mean); kernels.py.j2 writes them out as generated/<spec>/kernels.py."""
from __future__ import annotations

from dataclasses import replace

from codegen.plan import Plan, PoolPlan
from contract.abi import MTP_SLOT_FIELDS, Arg, KernelABI


def kernel_plans(plan: Plan) -> tuple[KernelABI, ...]:
    """Every kernel of a spec: main prefill, MTP prefill, one decode per layout, and
    with drafts to choose from, the K=0 layout again keeping the MTP slots (the adaptive
    policy's K=0 steps: the MTP layer's window stays whole, see _decode_keeping). A
    family that does not draft (V4.1 until issue 58) gets the main prefill and the K=0
    decode only."""
    if not plan.drafts:
        return (_prefill_main(plan, False),
                *(_decode(plan, lay.k, lay.batch, lay.seq, lay.kernel)
                  for lay in plan.layouts if lay.k == 0))
    kernels = [_prefill_main(plan, plan.has_mtp)]
    if plan.has_mtp:
        kernels.append(_prefill_mtp(plan))
    for layout in plan.layouts:
        make = _decode_mtp if layout.k > 0 else _decode
        kernels.append(make(plan, layout.k, layout.batch, layout.seq, layout.kernel))
    if plan.has_mtp and any(layout.k > 0 for layout in plan.layouts):
        kernels += [_decode_keeping(plan, layout.batch, layout.kernel)
                    for layout in plan.layouts if layout.k == 0]
    return tuple(kernels)


def _kernel(plan: Plan, name: str, kind: str, doc: str, rows: int, seq: int | None,
            k: int | None, args: tuple[Arg, ...]) -> KernelABI:
    return KernelABI(spec=plan.spec_name, name=name, kind=kind, doc=doc, rows=rows, seq=seq,
                     k=k, args=args, tile=plan.tile, max_extent=plan.max_extent,
                     ranks=plan.ranks, backend=dict(plan.topology)["backend"],
                     fingerprint=plan.fingerprint, context_buckets=plan.context_buckets)


def _staged(name: str, role: str, dtype: str, shape: tuple, expr: str, doc: str) -> Arg:
    return Arg(name, role, dtype, shape, expr, doc, staged=True)


def _block_tables(plan: Plan, rows: int, rows_sym: str) -> list[Arg]:
    return [
        _staged(f"block_table_{p.name}", "metadata", "int32", ("ranks", rows, p.table_width),
                f"[ranks, {rows_sym}, {p.table_width}]",
                f"rank-local {p.name} block ids per row; -1 (the scratch page) past the last "
                "block")
        for p in plan.pools
    ]


def _pool_arg(p: PoolPlan) -> Arg:
    return Arg(f"pool_{p.name}", "pool", p.storage_dtype,
               ("ranks", len(p.layers), "blocks", p.rows_per_page, p.storage_width),
               "[ranks, layers, blocks + 1, rows, width]", p.doc)


def _model_args(plan: Plan, rows: int, rows_sym: str,
                extra_pools: tuple[Arg, ...] = ()) -> list[Arg]:
    """Block tables, pools and weights: what every main-model kernel reads."""
    pools = [_pool_arg(p) for p in plan.pools]
    return [*_block_tables(plan, rows, rows_sym), *pools, *extra_pools, _weights()]


def _weights() -> Arg:
    return Arg("weights", "weight", None, (), "handle",
                   "loaded model weights; their fingerprint must match this spec's model")


def _engram_prior(plan: Plan, rows: int, rows_sym: str) -> list[Arg]:
    """V4.1 with Engram layers: the raw ids before each row (none for V4)."""
    if not plan.engram_prior:
        return []
    return [_staged("engram_prior", "input", "int64", ("ranks", rows, plan.engram_prior),
                    f"[ranks, {rows_sym}, engram_max_ngram_size - 1]",
                    "the raw token ids before each row's first token, oldest first; "
                    "engram_pad_token_id before the sequence starts (its Engram n-grams "
                    "reach back into them)")]


def _hidden_shape(plan: Plan) -> tuple[int, int]:
    return (plan.hc_mult, plan.hidden_size)


def _prefill_main(plan: Plan, has_mtp: bool) -> KernelABI:
    R, S, W = "ranks", plan.slots_per_rank, plan.mtp_window
    args = [
        _staged("token_ids", "input", "int64", (R, S, "extent"), "[ranks, slots, extent]",
                "chunk tokens per slot, padded to the extent"),
        *_engram_prior(plan, S, "slots"),
        _staged("start_pos", "metadata", "int32", (R, S), "[ranks, slots]",
                "position of each chunk's first token (its cached context length)"),
        _staged("chunk_lens", "metadata", "int32", (R, S), "[ranks, slots]",
                "valid tokens per slot; 0 marks an empty slot"),
        *_model_args(plan, S, "slots"),
        Arg("extent", "scalar", None, (), "int", "padded rows per slot: a tile multiple"),
        Arg("logits", "output", "float32", (R, S, plan.vocab_size), "[ranks, slots, vocab]",
                "logits of each slot's last valid row"),
    ]
    if has_mtp:
        args.append(Arg("mtp_hidden", "output", plan.dtype, (R, S, W, *_hidden_shape(plan)),
                            "[ranks, slots, mtp_window, hc_mult, hidden]",
                            "pre-hc_head streams of each slot's last min(mtp_window, chunk_len) "
                            "rows, row 0 first"))
    doc = (f"Main-model prefill: up to {S} chunks per rank, each a dynamic extent of at most "
           f"{plan.max_extent} rows walked in {plan.tile}-row tiles.")
    return _kernel(plan, "prefill_main", "prefill_main", doc, S, None, None, tuple(args))


def _prefill_mtp(plan: Plan) -> KernelABI:
    R, S, W = "ranks", plan.slots_per_rank, plan.mtp_window
    ori = next(p for p in plan.pools if p.name == "ori")
    args = (
        Arg("mtp_hidden", "input", plan.dtype, (R, S, W, *_hidden_shape(plan)),
                "[ranks, slots, mtp_window, hc_mult, hidden]",
                "the main prefill's mtp_hidden output"),
        _staged("next_ids", "input", "int64", (R, S, W), "[ranks, slots, mtp_window]",
                "token at position i+1 for each window row i"),
        _staged("start_pos", "metadata", "int32", (R, S), "[ranks, slots]",
                "position of window row 0"),
        _staged("num_rows", "metadata", "int32", (R, S), "[ranks, slots]",
                "window rows whose next token is known; 0 marks an empty slot"),
        *_block_tables(plan, S, "slots")[:1],
        _pool_arg(ori),
        _weights(),
    )
    doc = (f"MTP prefill: rebuilds the MTP layer's sliding KV from the last {W} pre-hc_head "
           "rows of a main prefill and the tokens that follow them.")
    return _kernel(plan, "prefill_mtp", "prefill_mtp", doc, S, None, None, args)


def _context() -> Arg:
    return Arg("context", "scalar", None, (), "int",
                   "positions the longest row reaches (its position + seq): the decode graph "
                   "of the smallest context bucket holding it serves the launch")


def _decode(plan: Plan, k: int, batch: int, seq: int, name: str) -> KernelABI:
    R = "ranks"
    args = (
        _staged("token_ids", "input", "int64", (R, batch, seq), "[ranks, batch, seq]",
                "input tokens per row"),
        *_engram_prior(plan, batch, "batch"),
        _staged("positions", "metadata", "int32", (R, batch), "[ranks, batch]",
                "position of each row's first token"),
        _staged("row_lens", "metadata", "int32", (R, batch), "[ranks, batch]",
                f"tokens per row: {seq}, or 0 for an empty row"),
        *_model_args(plan, batch, "batch"),
        _context(),
        Arg("logits", "output", "float32", (R, batch, seq, plan.vocab_size),
                "[ranks, batch, seq, vocab]", "logits of every row token"),
    )
    doc = f"Decode B{batch}S{seq}: {batch} rows of {seq} token per rank, no speculation."
    return _kernel(plan, name, "decode", doc, batch, seq, k, args)


def _decode_keeping(plan: Plan, batch: int, name: str) -> KernelABI:
    """The plain decode as a fused one of no drafts: each row also writes the MTP
    layer's sliding KV of the row before its tail (from its slot, as a first draft
    would) and returns its streams, so its slot advances as after a fused step."""
    abi = _decode_mtp(plan, 0, batch, 1, name + "_mtp")
    doc = (f"Decode B{batch}S1 keeping the MTP slots (K=0 of a policy that drafts on other "
           "steps): per row, the MTP layer's KV of the row before the tail from the "
           "slot's state, then the main model on [tail]; no drafts.")
    return replace(abi, doc=doc)


def _decode_mtp(plan: Plan, k: int, batch: int, seq: int, name: str) -> KernelABI:
    R, N = "ranks", plan.request_slots_per_rank + 1
    hidden = _hidden_shape(plan)
    args = (
        _staged("slot_ids", "metadata", "int32", (R, batch), "[ranks, batch]",
                "MTP state slot of each row; -1 marks an empty row"),
        _staged("slot_gens", "metadata", "int64", (R, batch), "[ranks, batch]",
                "expected slot generation; a row whose slot moved on is left untouched"),
        _staged("draft_mask", "input", "int32", (R, batch, (plan.vocab_size + 31) // 32),
                "[ranks, batch, ceil(vocab / 32)]",
                "tokens the first draft may take (bit t % 32 of word t // 32): a "
                "constrained row's grammar mask at its tail; all bits set for the others"),
        *_model_args(plan, batch, "batch", extra_pools=(
        Arg("mtp_slots", "pool", "int64", (R, N, len(MTP_SLOT_FIELDS)),
                f"[ranks, slots + 1, {len(MTP_SLOT_FIELDS)}]",
                "per slot: " + ", ".join(MTP_SLOT_FIELDS) + "; the last slot is scratch"),
        Arg("mtp_slot_hidden", "pool", plan.dtype, (R, N, *hidden),
                "[ranks, slots + 1, hc_mult, hidden]",
                "per slot: pre-hc_head streams of the row before the tail token"),
        )),
        _context(),
        Arg("logits", "output", "float32", (R, batch, seq, plan.vocab_size),
                "[ranks, batch, seq, vocab]", "main-model logits of rows [tail, drafts...]"),
        Arg("hidden", "output", plan.dtype, (R, batch, seq, *hidden),
                "[ranks, batch, seq, hc_mult, hidden]", "pre-hc_head streams of every row token"),
        Arg("draft_ids", "output", "int64", (R, batch, k), "[ranks, batch, k]",
                "the MTP drafts this step verified"),
    )
    doc = (f"Fused decode + MTP draft B{batch}S{seq} (K={k}): per row, drafts {k} token(s) "
           "from the slot's state, then runs the main model on [tail, drafts].")
    return _kernel(plan, name, "decode_mtp", doc, batch, seq, k, args)
