"""What each pool group holds, as facts of the architecture.

V4 has seven groups (DESIGN.md section 4). V4.1 (CSA2) has a group set that follows its
kv sources: every layer's window (ori); for the kv sources of each compress ratio r,
their compressed KV (cmp_c{r}) and index keys (idx_c{r}); for r > 1, their compressor's
open group (state_c{r}). Reindex, Reuse and window-only layers read a source's rows and
own nothing beyond their window; candidate masks are per-launch transients, no pool.

The spec declares every group's layout explicitly; these roles are what the declaration
must agree with (checked in `invariants.py`) and how the plan derives block counts.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from codegen.schema import ModelSection
from contract.model_args import ModelArgs

RATIO_KIND = {0: "sliding", 4: "csa", 128: "hca"}


@dataclass(frozen=True)
class PoolRole:
    """The architectural meaning of one pool group.

    kinds:     layer label (V4 kind, V4.1 role) whose layers own a page of this group
               ("all" = every layer)
    policy:    "ring" reuses a request's pages modulo its ring size; "full" keeps history
    ratio:     tokens per row: 1 for per-token rows, the compression ratio for entries
    span:      rows a compressor state must hold (ratio, twice that when overlapped)
    width:     row width from the model dims, and its formula for messages
    formats:   the entry formats a row may be stored in (contract/entry_formats.py):
               attention entries as they are or V4's fp8_ds, indexer keys as they are or
               FP8 / FP4, compressor state as it is (float32); V4.1's fp8_32 windows,
               fp4_16 compressed entries and fp4_32 index keys
    source_ratio: V4.1: only the layers of this compress ratio (a source group's)
    """

    name: str
    kinds: str
    policy: str
    ratio: int
    span: int | None
    width: Callable[[Any], int]
    width_expr: str
    doc: str
    formats: tuple[str, ...] = ("compute",)
    source_ratio: int | None = None

    @property
    def is_state(self) -> bool:
        return self.span is not None


_ENTRIES = ("compute", "fp8_ds")

ROLES: tuple[PoolRole, ...] = (
    PoolRole("ori", "all", "ring", 1, None, lambda m: m.head_dim, "head_dim",
             "sliding-window KV of every layer, the MTP layer included", _ENTRIES),
    PoolRole("cmp_c128", "hca", "full", 128, None, lambda m: m.head_dim, "head_dim",
             "HCA compressed KV entries (ratio 128)", _ENTRIES),
    PoolRole("cmp_c4", "csa", "full", 4, None, lambda m: m.head_dim, "head_dim",
             "CSA compressed KV entries (ratio 4)", _ENTRIES),
    PoolRole("idx", "csa", "full", 4, None, lambda m: m.index_head_dim, "index_head_dim",
             "lightning-indexer compressed keys (ratio 4)", ("compute", "fp8", "fp4")),
    PoolRole("hca_state", "hca", "ring", 1, 128, lambda m: 2 * m.head_dim, "2*head_dim",
             "C128 compressor state: pending kv and gate-score rows"),
    PoolRole("csa_state", "csa", "ring", 1, 8, lambda m: 4 * m.head_dim, "4*head_dim",
             "C4 compressor state: two overlapped windows of kv and gate-score rows"),
    PoolRole("csa_inner_state", "csa", "ring", 1, 8, lambda m: 4 * m.index_head_dim,
             "4*index_head_dim", "indexer compressor state: as csa_state at index_head_dim"),
)

ROLE_BY_NAME = {role.name: role for role in ROLES}


def model_args(model: Any) -> ModelArgs:
    """The contract's reading of a spec's model section (either family)."""
    return ModelArgs.from_config(model.model_dump(mode="json"))


def pool_roles(model: Any) -> tuple[PoolRole, ...]:
    """The groups a model needs, in the order a spec lists them."""
    return v41_roles(model) if model.FAMILY == "deepseek_v41" else ROLES


def v41_roles(model: Any) -> tuple[PoolRole, ...]:
    """ori, then per kv-source ratio (ascending) its compressed KV, its index keys and,
    above ratio 1, its compressor state: kv and score rows of the open group (slot =
    pos % r, float32), nothing at ratio 1 where an entry is one token."""
    ratios = sorted({r for r in source_ratios(model_args(model)) if r > 0})
    roles = [PoolRole("ori", "all", "ring", 1, None, lambda m: m.head_dim, "head_dim",
                      "window KV of every layer; the DSpark stages' main_kv rows",
                      ("compute", "fp8_32"))]
    roles += [PoolRole(f"cmp_c{r}", "full", "full", r, None, lambda m: m.head_dim,
                       "head_dim", f"compressed KV of the ratio-{r} kv sources",
                       ("compute", "fp4_16"), source_ratio=r) for r in ratios]
    roles += [PoolRole(f"idx_c{r}", "full", "full", r, None, lambda m: m.index_head_dim,
                       "index_head_dim", f"index keys of the ratio-{r} kv sources",
                       ("compute", "fp4_32"), source_ratio=r) for r in ratios]
    roles += [PoolRole(f"state_c{r}", "full", "ring", 1, r, lambda m: 2 * m.head_dim,
                       "2*head_dim", f"ratio-{r} compressor state: the open group's kv and "
                       "gate-score rows", source_ratio=r) for r in ratios if r > 1]
    return tuple(roles)


def source_ratios(args: ModelArgs) -> list[int]:
    """The compress ratio of each kv source, in source order."""
    return [args.ratio(layer) for layer in args.kv_source_layers]


def layer_kinds(model: ModelSection) -> list[str]:
    """Kind of every layer id: the main layers, then the MTP layers ("mtp")."""
    main = [RATIO_KIND[r] for r in model.compress_ratios[: model.num_hidden_layers]]
    return main + ["mtp"] * model.num_nextn_predict_layers


def layer_labels(model: Any) -> list[str]:
    """What pool groups select layers by: V4's kind, V4.1's role, for every layer id."""
    if model.FAMILY != "deepseek_v41":
        return layer_kinds(model)
    args = model_args(model)
    return [args.role(i) for i in range(args.n_layers + args.n_mtp_layers)]


def role_layers(role: PoolRole, kinds: Sequence[str],
                ratios: Sequence[int] = ()) -> list[int]:
    """Layer ids that own a page of `role`'s group (`ratios`: each layer's compress
    ratio, needed by a role with a source_ratio)."""
    return [i for i, kind in enumerate(kinds) if role.kinds in ("all", kind)
            and (role.source_ratio is None or ratios[i] == role.source_ratio)]


def role_kinds(role: PoolRole, kinds: Sequence[str], ratios: Sequence[int] = ()) -> list[str]:
    """The sorted layer kinds a group's `layers` field must list."""
    return sorted({kinds[i] for i in role_layers(role, kinds, ratios)})
