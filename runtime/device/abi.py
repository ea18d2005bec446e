"""Support types for the generated launch wrappers: argument descriptors and checks.

Generated code (generated/<spec>/) spells out every shape and formula as literals and
calls these helpers to check and stage arguments, so the checks read the same for every
spec and every kernel. Nothing here knows a spec.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from contract.decode_layout import DecodeLayout  # noqa: F401  (the generated contracts' import)

# Host-side integer data a wrapper stages: a tensor, a numpy array or nested lists.
HostData = Any


class ABIError(ValueError):
    """An argument does not match the kernel's ABI: name, expected and actual."""


@dataclass(frozen=True)
class Arg:
    """One argument of a kernel launch.

    role:   input | metadata | pool | weight | scalar | output
    shape:  None marks a dimension fixed at run time (the ranks a wrapper drives, a
            pool's block count, the extent)
    expr:   the symbolic shape, for messages and docs
    """

    name: str
    role: str
    dtype: torch.dtype | None
    shape: tuple[int | None, ...]
    expr: str


@dataclass(frozen=True)
class PoolGroup:
    """One pool group of a spec: a tensor [ranks, layers, blocks + 1, rows_per_page,
    row_width] whose last block is the scratch page.

    Scheduler block b of the group owns page b in every layer of `layers`.
    """

    name: str
    layers: tuple[int, ...]
    rows_per_page: int
    row_width: int
    dtype: torch.dtype
    policy: str                        # "ring" (pages reused modulo ring_pages) | "full"
    tokens_per_row: int                # 1, or the compression ratio of an entry
    ring_pages: int | None
    table_width: int                   # block-table entries per request
    page_bytes: int                    # one layer's page
    block_bytes: int                   # one scheduler block: a page in every layer
    blocks_for: Callable[[int], int]   # blocks a request of `len` positions holds
    formula: str

    def layer_index(self, layer_id: int) -> int:
        """Index of `layer_id` along dim 0 of this group's tensors."""
        return self.layers.index(layer_id)


@dataclass(frozen=True)
class KernelABI:
    """What a backend needs to dispatch and check a launch: the kernel's kind, its
    arguments, the spec's pool-group geometry, the prefill tile, the context buckets
    and (fused decode + MTP) the columns of the MTP slot table."""

    spec: str
    name: str
    kind: str
    args: tuple[Arg, ...]
    groups: Mapping[str, PoolGroup]
    tile: int
    context_buckets: tuple[int, ...] = ()
    mtp_field: type[enum.IntEnum] | None = None

    def context_bucket(self, length: int) -> int:
        """The smallest context bucket holding `length` positions."""
        for bucket in self.context_buckets:
            if length <= bucket:
                return bucket
        raise ABIError(f"{self.name}: a context of {length} positions exceeds the largest "
                       f"bucket {self.context_buckets[-1]}")



def fits(shape: Sequence[int], want: Sequence[int | None]) -> bool:
    return len(shape) == len(want) and all(w is None or s == w for s, w in zip(shape, want))


def fmt_shape(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ")"


def stage(buf: torch.Tensor, value: Any, arg: Arg) -> torch.Tensor:
    """Copy `value` (tensor, ndarray or nested list) into the staging view `buf`.

    Tensors must already have the buffer's dtype: no silent cast on the launch path.
    Host integer data is converted to the buffer's integer dtype.
    """
    if isinstance(value, torch.Tensor):
        if value.dtype != buf.dtype:
            raise ABIError(f"{arg.name}: dtype {value.dtype}, expected {buf.dtype}")
        src = value
    else:
        array = np.asarray(value)
        if array.dtype.kind not in "iub":
            raise ABIError(f"{arg.name}: host data of kind {array.dtype}, expected integers")
        src = torch.from_numpy(np.ascontiguousarray(array)).to(buf.dtype)
    if tuple(src.shape) != tuple(buf.shape):
        raise ABIError(f"{arg.name}: shape {tuple(src.shape)}, expected "
                       f"{tuple(buf.shape)} {arg.expr}")
    buf.copy_(src, non_blocking=True)
    return buf


def check_tensor(value: Any, arg: Arg, shape: Sequence[int | None],
                 device: torch.device) -> torch.Tensor:
    """A device tensor passed through as is: type, dtype, shape and device must match."""
    if not isinstance(value, torch.Tensor):
        raise ABIError(f"{arg.name}: expected a tensor {arg.expr}, got {type(value).__name__}")
    if value.dtype != arg.dtype:
        raise ABIError(f"{arg.name}: dtype {value.dtype}, expected {arg.dtype}")
    if not fits(value.shape, shape):
        raise ABIError(f"{arg.name}: shape {tuple(value.shape)}, expected "
                       f"{fmt_shape(shape)} {arg.expr}")
    if value.device != device:
        raise ABIError(f"{arg.name}: on {value.device}, the launch runs on {device}")
    return value


def check_extent(extent: Any, tile: int, max_extent: int) -> int:
    """The dynamic prefill extent: a positive tile multiple up to max_extent."""
    if isinstance(extent, bool) or not isinstance(extent, int) \
            or not 0 < extent <= max_extent or extent % tile:
        raise ABIError(f"extent: {extent!r} must be a multiple of the tile {tile} "
                       f"in [{tile}, {max_extent}]")
    return extent


def check_weights(weights: Any, fingerprint: str, spec: str) -> Any:
    """Weights must say they were loaded for this spec's architecture."""
    got = getattr(weights, "fingerprint", None)
    if got != fingerprint:
        raise ABIError(f"weights: fingerprint {got!r} does not match spec {spec} "
                       f"({fingerprint!r}); load the checkpoint for this spec")
    return weights
