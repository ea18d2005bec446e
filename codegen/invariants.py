"""The one place for checks that span fields of a spec.

`check_invariants` returns every violated invariant as (field path, message); the
caller attaches file and line. Per-field types and ranges live in `schema.py` (V4) and
`schema_v41.py`; the checks only V4.1 has (layer roles and their sources, Engram,
DSpark) live in `invariants_v41.py` and run from here.
"""
from __future__ import annotations

from collections.abc import Iterator

from codegen.invariants_v41 import check_v41_model, check_v41_spec
from codegen.pool_roles import layer_labels, model_args, pool_roles, role_kinds
from codegen.schema import ModelSection, Spec
from codegen.yaml_loader import FieldPath
from contract.abi import INDEXER_TILES
from contract.entry_formats import SCALE_BLOCK

Problem = tuple[FieldPath, str]


def check_invariants(spec: Spec) -> list[Problem]:
    """All cross-field problems of `spec` (either family), in section order."""
    problems: list[Problem] = list(_model(spec))
    if problems:  # the other checks read the layer layout; it must be sound first
        return problems
    for check in (_topology, _weights, _prefill, _decode, _pools, _limits,
                  *FAMILY_CHECKS[spec.model.FAMILY]):
        problems.extend(check(spec))
    return problems


def _model(spec: Spec) -> Iterator[Problem]:
    m = spec.model
    want = m.num_hidden_layers + m.num_nextn_predict_layers
    if len(m.compress_ratios) != want:
        yield (("model", "compress_ratios"),
               f"has {len(m.compress_ratios)} entries; need num_hidden_layers + "
               f"num_nextn_predict_layers = {m.num_hidden_layers} + "
               f"{m.num_nextn_predict_layers} = {want}")
        return
    yield from MODEL_CHECKS[m.FAMILY](m)
    yield from _dims(m)


def _v4_model(m: ModelSection) -> Iterator[Problem]:
    """V4's own: MTP layers slide, hash layers are main layers, CSA keys carry RoPE."""
    for i in range(m.num_hidden_layers, len(m.compress_ratios)):
        if m.compress_ratios[i] != 0:
            yield (("model", "compress_ratios", i),
                   f"MTP layer {i} must be sliding-window only (0), not {m.compress_ratios[i]}")
    if m.num_hash_layers > m.num_hidden_layers:
        yield (("model", "num_hash_layers"),
               f"{m.num_hash_layers} exceeds num_hidden_layers {m.num_hidden_layers}")
    if 4 in m.compress_ratios and m.index_head_dim < m.qk_rope_head_dim:
        yield (("model", "index_head_dim"),
               f"must be at least qk_rope_head_dim {m.qk_rope_head_dim}, not {m.index_head_dim}")


def _dims(m: ModelSection) -> Iterator[Problem]:
    """What both families' dims must satisfy."""
    if m.qk_rope_head_dim % 2 or m.qk_rope_head_dim > m.head_dim:
        yield (("model", "qk_rope_head_dim"),
               f"must be even and at most head_dim {m.head_dim}, not {m.qk_rope_head_dim}")
    if (m.num_attention_heads * m.head_dim) % m.o_groups:
        yield (("model", "o_groups"),
               f"must divide num_attention_heads*head_dim = "
               f"{m.num_attention_heads * m.head_dim}, not {m.o_groups}")
    if m.num_experts_per_tok > m.n_routed_experts:
        yield (("model", "num_experts_per_tok"),
               f"{m.num_experts_per_tok} exceeds n_routed_experts {m.n_routed_experts}")
    for key in ("bos_token_id", "eos_token_id"):
        if getattr(m, key) >= m.vocab_size:
            yield (("model", key), f"{getattr(m, key)} is outside vocab_size {m.vocab_size}")


def _topology(spec: Spec) -> Iterator[Problem]:
    t, m = spec.topology, spec.model
    if t.dp * t.tp != t.ranks:
        yield (("topology", "dp"), f"dp*tp = {t.dp}*{t.tp} must equal ranks {t.ranks}")
    if t.ep != t.ranks:
        yield (("topology", "ep"),
               f"expert parallelism runs on the same ranks as attention: ep must equal "
               f"ranks {t.ranks}, not {t.ep}")
    elif m.n_routed_experts % t.ep:
        yield (("topology", "ep"),
               f"{t.ep} does not divide n_routed_experts {m.n_routed_experts}")


def _weights(spec: Spec) -> Iterator[Problem]:
    w, m = spec.weights, spec.model
    if w.format not in ("as_released", spec.topology.dtype):
        yield (("weights", "format"),
               f"{w.format!r}: the weights are held as released or dequantized to the "
               f"compute dtype ({spec.topology.dtype!r})")
    if w.experts == "fp4":
        for key in ("hidden_size", "moe_intermediate_size"):
            if getattr(m, key) % 32:
                yield (("weights", "experts"),
                       f"fp4 experts take a scale per 32 inputs: model.{key} "
                       f"{getattr(m, key)} is not a multiple of 32")


def _prefill(spec: Spec) -> Iterator[Problem]:
    p, m = spec.prefill, spec.model
    if p.max_extent % p.tile:
        yield (("prefill", "tile"),
               f"{p.tile} does not divide max_extent {p.max_extent}")
    if p.mtp_window > p.max_extent:
        yield (("prefill", "mtp_window"),
               f"{p.mtp_window} exceeds max_extent {p.max_extent}")
    if m.num_nextn_predict_layers and p.mtp_window < m.sliding_window:
        yield (("prefill", "mtp_window"),
               f"must cover the MTP layer's sliding_window {m.sliding_window}, not {p.mtp_window}")


def _decode(spec: Spec) -> Iterator[Problem]:
    d, m = spec.decode, spec.model
    advertised = d.num_speculative_tokens
    for i, k in enumerate(advertised):
        if k < 0 or k in advertised[:i]:
            yield (("decode", "num_speculative_tokens", i), f"{k} is negative or repeated")
        elif k > 0 and m.num_nextn_predict_layers == 0:
            yield (("decode", "num_speculative_tokens", i),
                   f"K={k} needs an MTP layer; model.num_nextn_predict_layers is 0")
        elif not any(layout.k == k for layout in d.layouts):
            yield (("decode", "num_speculative_tokens", i),
                   f"K={k} has no decode layout; add one with k: {k}, seq: {k + 1}")
    if d.default_num_speculative_tokens not in advertised:
        yield (("decode", "default_num_speculative_tokens"),
               f"{d.default_num_speculative_tokens} is not one of num_speculative_tokens "
               f"{advertised}")
    seen: set[int] = set()
    for i, layout in enumerate(d.layouts):
        at = ("decode", "layouts", i)
        if layout.seq != layout.k + 1:
            yield (at + ("seq",),
                   f"must be k + 1 = {layout.k + 1} for k={layout.k}, not {layout.seq}")
        if layout.k in seen:
            yield (at + ("k",), f"a second layout for K={layout.k}; keep one per K")
        elif layout.k not in advertised:
            yield (at + ("k",), f"K={layout.k} is not in num_speculative_tokens {advertised}")
        seen.add(layout.k)


def _pools(spec: Spec) -> Iterator[Problem]:
    m, pools = spec.model, spec.pools
    labels, ratios = layer_labels(m), list(m.compress_ratios)
    roles = pool_roles(m)
    yield from _group_names(pools, roles)
    for role in roles:
        group = pools.group(role.name)
        if group is None:
            continue
        at = ("pools", "groups", role.name)
        want_kinds = role_kinds(role, labels, ratios)
        if sorted(set(group.layers)) != want_kinds or len(group.layers) != len(set(group.layers)):
            yield (at + ("layers",), f"{group.layers} must be {want_kinds} for this model")
        if group.row_width != role.width(m):
            yield (at + ("row_width",),
                   f"{group.row_width} must be {role.width_expr} = {role.width(m)}")
        if group.policy != role.policy:
            yield (at + ("policy",), f"{role.name} is a {role.policy} group, not {group.policy}")
        if role.is_state and group.dtype != "float32":
            yield (at + ("dtype",), f"compressor state is kept in float32, not {group.dtype}")
        yield from _format(m, role, group, at + ("format",))
        yield from _rows_per_page(role.name, role.ratio, role.span, group.rows_per_page,
                                  pools.block_size)


def _group_names(pools, roles) -> Iterator[Problem]:
    """A V4.1 spec names its groups (V4's seven are fields of the schema): exactly the
    ones its kv sources need."""
    if not isinstance(pools.groups, dict):
        return
    want = [role.name for role in roles]
    for name in pools.groups:
        if name not in want:
            yield (("pools", "groups", name),
                   f"no layer of this model owns a {name} group; its groups are "
                   f"{', '.join(want)}")
    for role in roles:
        if role.name not in pools.groups:
            yield (("pools", "groups"), f"missing group {role.name} ({role.doc})")


def _format(m, role, group, at) -> Iterator[Problem]:
    """The entry format fits the group's rows: fp8_ds quantizes the non-RoPE values in
    blocks of 64; the indexer's FP8/FP4 keys are rotated (a power-of-two Hadamard) and
    FP4 scales blocks of 32."""
    if group.format not in role.formats:
        yield (at, f"{role.name} rows may be stored as {' or '.join(role.formats)}, "
                   f"not {group.format}")
    elif group.format == "fp8_ds" and (group.row_width - m.qk_rope_head_dim) % 64:
        yield (at, f"fp8_ds needs row_width - qk_rope_head_dim = "
                   f"{group.row_width - m.qk_rope_head_dim} to be a multiple of 64")
    elif group.format in ("fp8", "fp4") and (group.row_width & (group.row_width - 1)
                                             or group.row_width < 32):
        yield (at, f"{group.format} indexer keys are Hadamard-rotated: row_width must be a "
                   f"power of two of at least 32, not {group.row_width}")
    elif group.format in SCALE_BLOCK and group.row_width % SCALE_BLOCK[group.format]:
        yield (at, f"{group.format} takes a scale per {SCALE_BLOCK[group.format]} values: "
                   f"row_width {group.row_width} is not a multiple")


def _rows_per_page(name: str, ratio: int, span: int | None, rows: int,
                   block_size: int) -> Iterator[Problem]:
    at = ("pools", "groups", name, "rows_per_page")
    if span is not None:
        if span % rows:
            yield (at, f"{rows} must divide the state span {span}")
    elif block_size % ratio:
        yield (("pools", "block_size"), f"{block_size} is not a multiple of ratio {ratio}")
    elif rows != block_size // ratio:
        yield (at, f"{rows} must be block_size/{ratio} = {block_size // ratio}")


def _context_buckets(spec: Spec) -> Iterator[Problem]:
    buckets, lim = spec.decode.context_buckets, spec.limits
    block = spec.pools.block_size
    at = ("decode", "context_buckets")
    indexed = _indexed(spec.model)
    for i, bucket in enumerate(buckets):
        if i and bucket <= buckets[i - 1]:
            yield (at + (i,), f"{bucket} must exceed the bucket before it ({buckets[i - 1]})")
        elif bucket % block:
            yield (at + (i,), f"{bucket} must be a multiple of pools.block_size {block}")
        else:
            yield from _indexed_bucket(at + (i,), bucket, indexed, spec.model.index_topk)
    if buckets[-1] != lim.max_model_len:
        yield (at + (len(buckets) - 1,),
               f"the last bucket must be limits.max_model_len {lim.max_model_len}, "
               f"not {buckets[-1]}")


def _indexed(m: ModelSection) -> list[tuple[int, str]]:
    """The ratios whose entries a decode indexer scores, each with its entries' name:
    V4's CSA layers (4); V4.1's index sources."""
    if m.FAMILY == "deepseek_v41":
        args = model_args(m)
        ratios = sorted({args.ratio(layer) for layer in args.index_source_layers})
        return [(r, f"ratio-{r} entries") for r in ratios]
    return [(4, "CSA entries")] if 4 in m.compress_ratios else []


def _indexed_bucket(at: FieldPath, bucket: int, indexed: list[tuple[int, str]],
                    topk: int) -> Iterator[Problem]:
    """The first rule a bucket breaks for the entries an indexer scores in it."""
    for ratio, entries in indexed:
        if bucket % (ratio * INDEXER_TILES):
            yield (at, f"{bucket} holds {bucket / ratio:g} {entries}, which the decode "
                       f"indexer scores in {INDEXER_TILES} equal tiles: it must be a "
                       f"multiple of {ratio * INDEXER_TILES}")
            return
        if bucket // ratio < topk:
            yield (at, f"{bucket} holds {bucket // ratio} {entries}, fewer than "
                       f"index_topk {topk}; the smallest bucket is {ratio * topk}")
            return


def _limits(spec: Spec) -> Iterator[Problem]:
    yield from _context_buckets(spec)
    lim, d, m, t = spec.limits, spec.decode, spec.model, spec.topology
    if lim.max_model_len > m.max_position_embeddings:
        yield (("limits", "max_model_len"),
               f"{lim.max_model_len} exceeds max_position_embeddings {m.max_position_embeddings}")
    for layout in d.layouts:
        capacity = t.dp * layout.batch * d.micro_batches
        if lim.max_num_seqs > capacity:
            yield (("limits", "max_num_seqs"),
                   f"{lim.max_num_seqs} exceeds the K={layout.k} decode capacity ranks*batch*"
                   f"micro_batches = {t.dp}*{layout.batch}*{d.micro_batches} = {capacity}")
        step_rows = layout.batch * layout.seq * d.micro_batches
        if lim.max_num_batched_tokens < step_rows:
            yield (("limits", "max_num_batched_tokens"),
                   f"{lim.max_num_batched_tokens} cannot hold one K={layout.k} decode step of a "
                   f"rank: batch*seq*micro_batches = {step_rows}")


MODEL_CHECKS = {"deepseek_v4": _v4_model, "deepseek_v41": check_v41_model}
# checks of the other sections only one family has
FAMILY_CHECKS = {"deepseek_v4": (), "deepseek_v41": (check_v41_spec,)}
