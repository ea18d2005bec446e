"""The derived plan: frozen, fully resolved facts that the templates render.

Templates see only these dataclasses, never the raw spec: every count, width, byte size
and argument list is computed here once, in Python, where it can be tested.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from codegen.family import NO_DRAFTS, ONLY_BACKENDS, Family, family_of
from codegen.pool_roles import PoolRole, layer_labels, model_args, pool_roles, role_layers
from codegen.schema import LayoutEntry, Spec
from contract.decode_layout import DecodeLayout
from contract.entry_formats import entry_bytes

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class PoolPlan:
    """One pool group: per rank a tensor [layers, blocks, rows_per_page, row_width]."""

    name: str
    doc: str
    layers: tuple[int, ...]
    kinds: tuple[str, ...]
    rows_per_page: int
    row_width: int
    dtype: str
    policy: str
    tokens_per_row: int
    ring_pages: int | None
    table_width: int
    page_bytes: int
    block_bytes: int
    formula: str
    ring_rule: str | None
    format: str
    rope_width: int
    entry_bytes: int

    @property
    def storage_dtype(self) -> str:
        return "uint8" if self.format != "compute" else self.dtype

    @property
    def storage_width(self) -> int:
        return self.entry_bytes if self.format != "compute" else self.row_width



@dataclass(frozen=True)
class LayerRole:
    """A V4.1 layer's role and the sources it reads (None: reads none)."""

    layer: int
    role: str
    ratio: int
    kv_source: int | None
    index_source: int | None


@dataclass(frozen=True)
class Plan:
    """Everything one spec generates."""

    spec_name: str
    spec_path: str
    spec_sha256: str        # of the spec file's text: serving checks generated/ is current
    package: str
    fingerprint: str
    model: tuple[tuple[str, object], ...]
    layer_kinds: tuple[str, ...]
    num_main_layers: int
    family: str                 # ModelArgs.family: deepseek_v4 | deepseek_v41
    launchable: bool            # launch wrappers (kernels.py) are generated
    drafts: bool                # its decode kernels draft (MTP); False: K = 0 kernels only
    rehearsed: bool             # the compiled backend (which `v4serve rehearse` runs) runs them
    engram_prior: int           # V4.1: raw ids before a launch row a kernel takes (N - 1); 0: none
    served_notes: tuple[str, ...]   # where the contract serves other than the spec asks, and why
    layer_roles: tuple[LayerRole, ...]      # V4.1: every layer's role and sources; V4: ()
    topology: tuple[tuple[str, object], ...]
    weights: tuple[tuple[str, object], ...]
    ranks: int
    experts_per_rank: int
    tile: int
    max_extent: int
    slots_per_rank: int
    mtp_window: int
    block_size: int
    layouts: tuple[DecodeLayout, ...]
    default_k: int
    micro_batches: int
    context_buckets: tuple[int, ...]
    request_slots_per_rank: int
    has_mtp: bool
    mtp_slots: bool             # V4's MTP slot table (pools.MtpField); DSpark has none yet
    limits: tuple[tuple[str, int], ...]
    pools: tuple[PoolPlan, ...]
    dtype: str
    vocab_size: int
    hidden_size: int
    hc_mult: int

    @property
    def full_bytes_per_token(self) -> float:
        """Bytes of full-history rows (compressed KV, index keys) a token adds, over
        every layer of a rank: what grows with the context."""
        return sum(p.block_bytes for p in self.pools if p.policy == "full") / self.block_size

    @property
    def ring_bytes_per_request(self) -> int:
        """Bytes of ring rows (windows, compressor state) a request holds at most."""
        return sum(p.ring_pages * p.block_bytes for p in self.pools if p.ring_pages)


def package_name(spec_stem: str) -> str:
    """specs/deepseek-v4-flash.yaml -> "deepseek_v4_flash"."""
    name = "".join(c if c.isalnum() else "_" for c in spec_stem.lower())
    return f"spec_{name}" if name[0].isdigit() else name


def build_plan(spec: Spec, spec_path: str, spec_stem: str, spec_sha256: str) -> Plan:
    """Resolve a validated spec into the plan the templates render."""
    m = spec.model
    family, args = family_of(spec), model_args(m)
    labels, ratios = layer_labels(m), list(m.compress_ratios)
    pools = tuple(_pool_plan(spec, role, labels, ratios) for role in pool_roles(m))
    layers = range(args.n_layers + args.n_mtp_layers)
    layouts = tuple(_layout_plan(layout)
                    for layout in sorted(spec.decode.layouts, key=lambda lay: lay.k))
    # one device-state slot per running request of a rank, under the widest layout
    request_slots = max(lay.batch * spec.decode.micro_batches for lay in layouts)
    model_items = tuple(sorted(m.model_dump(mode="json").items()))
    topology, notes = _served_topology(spec, family)
    default_k = spec.decode.default_num_speculative_tokens if family.drafts else 0
    if default_k != spec.decode.default_num_speculative_tokens:
        notes += (f"DEFAULT_NUM_SPECULATIVE_TOKENS {default_k}, not the spec's "
                  f"{spec.decode.default_num_speculative_tokens}: "
                  + NO_DRAFTS.format(title=family.title),)
    return Plan(
        spec_name=spec_stem,
        spec_path=spec_path,
        spec_sha256=spec_sha256,
        package=package_name(spec_stem),
        fingerprint=_fingerprint(model_items),
        model=model_items,
        layer_kinds=tuple(args.kind(i) for i in layers),
        num_main_layers=m.num_hidden_layers,
        family=family.name,
        launchable=family.launchable,
        drafts=family.drafts,
        rehearsed=not family.backends or "compiled" in family.backends,
        engram_prior=args.engram_max_ngram - 1 if args.engram_layers else 0,
        served_notes=notes,
        layer_roles=tuple(LayerRole(i, args.role(i), args.ratio(i), args.kv_source(i),
                                    args.index_source(i)) for i in layers) if args.is_v41
        else (),
        topology=topology,
        weights=tuple(spec.weights.model_dump(mode="json").items()),
        ranks=spec.topology.dp,
        experts_per_rank=m.n_routed_experts // spec.topology.ep,
        tile=spec.prefill.tile,
        max_extent=spec.prefill.max_extent,
        slots_per_rank=spec.prefill.slots_per_rank,
        mtp_window=spec.prefill.mtp_window,
        block_size=spec.pools.block_size,
        layouts=layouts,
        default_k=default_k,
        micro_batches=spec.decode.micro_batches,
        context_buckets=tuple(spec.decode.context_buckets),
        request_slots_per_rank=request_slots,
        has_mtp=m.num_nextn_predict_layers > 0,
        mtp_slots=m.num_nextn_predict_layers > 0 and not args.is_v41,
        limits=tuple(spec.limits.model_dump(mode="json").items()),
        pools=pools,
        dtype=spec.topology.dtype,
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        hc_mult=m.hc_mult,
    )


def _served_topology(spec: Spec, family: Family
                     ) -> tuple[tuple[tuple[str, object], ...], tuple[str, ...]]:
    """The spec's topology with the backend its family's kernels run on, and a note
    when that is not the one the spec asks."""
    topology = spec.topology.model_dump(mode="json")
    asked = topology["backend"]
    topology["backend"] = family.served_backend(asked)
    if topology["backend"] == asked:
        return tuple(topology.items()), ()
    why = ONLY_BACKENDS.format(title=family.title, backends=", ".join(family.backends))
    return tuple(topology.items()), (f"BACKEND {topology['backend']!r}, not the spec's "
                                     f"{asked!r}: {why}",)


def _fingerprint(model_items: tuple[tuple[str, object], ...]) -> str:
    blob = json.dumps(dict(model_items), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _layout_plan(entry: LayoutEntry) -> DecodeLayout:
    return DecodeLayout.of(entry.k, entry.batch, entry.seq)


def _pool_plan(spec: Spec, role: PoolRole, labels: list[str], ratios: list[int]) -> PoolPlan:
    group = spec.pools.group(role.name)
    layers = tuple(role_layers(role, labels, ratios))
    ring_pages, formula, ring_rule = _ring_pages(spec, role, group.rows_per_page)
    if ring_pages is None:
        table_width = math.ceil(spec.limits.max_model_len // role.ratio / group.rows_per_page)
    else:
        table_width = ring_pages
    rope = spec.model.qk_rope_head_dim if group.format == "fp8_ds" else 0
    entry = entry_bytes(group.format, group.row_width, rope, DTYPE_BYTES[group.dtype])
    page_bytes = group.rows_per_page * entry
    return PoolPlan(
        name=role.name,
        doc=role.doc,
        layers=layers,
        kinds=tuple(sorted(set(group.layers))),
        rows_per_page=group.rows_per_page,
        row_width=group.row_width,
        dtype=group.dtype,
        policy=role.policy,
        tokens_per_row=role.ratio,
        ring_pages=ring_pages,
        table_width=table_width,
        page_bytes=page_bytes,
        block_bytes=page_bytes * len(layers),
        formula=formula,
        ring_rule=ring_rule,
        format=group.format,
        rope_width=rope,
        entry_bytes=entry,
    )


def _ring_pages(spec: Spec, role: PoolRole, rows: int) -> tuple[int | None, str, str | None]:
    """Ring size in pages, the per-request block formula, and how the ring was sized."""
    if role.policy == "full":
        return None, f"ceil((len // {role.ratio}) / {rows})", None
    in_flight = max(layout.seq for layout in spec.decode.layouts)
    if role.span is not None:
        # a step reads back the span before its first row and writes in_flight rows from
        # there; past the first, a rejected draft's row must not land on a row still to
        # be read back: span + in_flight - 2 rows (at least the span)
        held = role.span + max(0, in_flight - 2)
        pages = math.ceil(held / rows)
        return pages, f"min({pages}, ceil(len / {rows}))", \
            (f"ring = ceil((span {role.span} + in_flight {in_flight} - 2) / rows_per_page "
             f"{rows})")
    window = spec.model.sliding_window
    bs = spec.pools.block_size
    pages = math.ceil((window - 1 + in_flight) / bs) + 1
    return pages, f"min({pages}, ceil(len / {bs}))", \
        (f"ring = ceil((window - 1 + in_flight) / block_size) + 1 with window {window}, "
         f"in_flight {in_flight} (the widest decode row)")
