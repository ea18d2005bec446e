"""The checks a launcher makes of each argument, and the staging copy of host data.

Every message names the argument, what it expected and what it got: a launch refused
here never reaches a backend.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from contract.abi import ABIError, Arg


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a contract dtype name ("bfloat16", "int32") stands for."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ABIError(f"unknown dtype {name!r}")
    return dtype


def fits(shape: Sequence[int], want: Sequence[int | str | None]) -> bool:
    """Whether `shape` matches `want`, whose non-int dimensions (None, a symbol) match any."""
    return len(shape) == len(want) \
        and all(not isinstance(w, int) or s == w for s, w in zip(shape, want))


def fmt_shape(shape: Sequence[int | str | None]) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) else "*" for d in shape) + ")"


def stage(buf: torch.Tensor, value: Any, arg: Arg) -> torch.Tensor:
    """Copy `value` (tensor, ndarray or nested list) into the staging view `buf`.

    Tensors must already have the buffer's dtype: no silent cast on the launch path.
    Host integer data is converted to the buffer's integer dtype. The buffer itself
    (written in place before the launch: the block tables) is taken as it is.
    """
    if value is buf:
        return buf
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


def check_tensor(value: Any, arg: Arg, dtype: torch.dtype, shape: Sequence[int | None],
                 device: torch.device) -> torch.Tensor:
    """A device tensor passed through as is: type, dtype (arg's, as torch's `dtype`),
    shape and device must match."""
    if not isinstance(value, torch.Tensor):
        raise ABIError(f"{arg.name}: expected a tensor {arg.expr}, got {type(value).__name__}")
    if value.dtype != dtype:
        raise ABIError(f"{arg.name}: dtype {value.dtype}, expected torch.{arg.dtype}")
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
