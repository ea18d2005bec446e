"""What each of the seven pool groups holds, as facts of the architecture.

The spec declares every group's layout explicitly; these roles are what the declaration
must agree with (checked in `invariants.py`) and how the plan derives block counts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from codegen.schema import ModelSection

RATIO_KIND = {0: "sliding", 4: "csa", 128: "hca"}


@dataclass(frozen=True)
class PoolRole:
    """The architectural meaning of one pool group.

    kinds:     layer kinds whose layers own a page of this group ("all" = every layer)
    policy:    "ring" reuses a request's pages modulo its ring size; "full" keeps history
    ratio:     tokens per row: 1 for per-token rows, the compression ratio for entries
    span:      rows a compressor state must hold (ratio, twice that when overlapped)
    width:     row width from the model dims, and its formula for messages
    formats:   the entry formats a row may be stored in (contract/entry_formats.py):
               attention entries as they are or V4's fp8_ds, indexer keys as they are or
               FP8 / FP4, compressor state as it is (float32)
    """

    name: str
    kinds: str
    policy: str
    ratio: int
    span: int | None
    width: Callable[[ModelSection], int]
    width_expr: str
    doc: str
    formats: tuple[str, ...] = ("compute",)

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


def layer_kinds(model: ModelSection) -> list[str]:
    """Kind of every layer id: the main layers, then the MTP layers ("mtp")."""
    main = [RATIO_KIND[r] for r in model.compress_ratios[: model.num_hidden_layers]]
    return main + ["mtp"] * model.num_nextn_predict_layers


def role_layers(role: PoolRole, kinds: list[str]) -> list[int]:
    """Layer ids that own a page of `role`'s group."""
    return [i for i, kind in enumerate(kinds) if role.kinds in ("all", kind)]


def role_kinds(role: PoolRole, kinds: list[str]) -> list[str]:
    """The sorted layer kinds a group's `layers` field must list."""
    return sorted({kinds[i] for i in role_layers(role, kinds)})
