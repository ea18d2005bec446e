"""The dry-run backend: re-checks every launch against its ABI and computes nothing.

It lets the scheduler, pools and launchers run end to end without a model (tests, dry
runs of a spec). Outputs are left as the launcher allocated them. Beyond the launcher's
own shape checks it validates values: block ids inside each rank's pool, row lengths
inside the launch. On the meta device (a dry run at a deployment's scale, as
bench/host_overhead.py drives one) tensors have no values: shapes only.
"""
from __future__ import annotations

from functools import cache

import torch

from contract.abi import ABIError, Arg, KernelABI
from runtime.backends import Backend
from runtime.backends.arg_checks import fits, fmt_shape, torch_dtype

# Row-length arguments and the token argument whose last dimension bounds them.
_ROW_BOUNDS = {"chunk_lens": "token_ids", "row_lens": "token_ids", "num_rows": "next_ids"}


class DryRunBackend(Backend):
    """Eager, one process: every capability at its default."""

    name = "dryrun"

    def __init__(self) -> None:
        self.launches: dict[str, int] = {}

    def launch(self, kernel: KernelABI, args) -> None:
        named = args._asdict()
        missing = [a.name for a in kernel.args if a.name not in named]
        if missing:
            raise ABIError(f"{kernel.name}: no argument {missing[0]!r}")
        for arg, dtype in _checked(kernel):
            _check_arg(kernel.name, arg, dtype, named[arg.name])
        if named["pool_ori"].device.type != "meta":          # meta: no values to check
            _check_block_ids(kernel, named)
            _check_row_lens(kernel, named)
        self.launches[kernel.name] = self.launches.get(kernel.name, 0) + 1


@cache
def _checked(kernel: KernelABI) -> tuple[tuple[Arg, torch.dtype], ...]:
    """The kernel's tensor arguments (not weights or scalars) and their dtypes."""
    return tuple((a, torch_dtype(a.dtype)) for a in kernel.args
                 if a.role not in ("weight", "scalar"))


def _check_arg(kernel: str, arg: Arg, dtype: torch.dtype, value: object) -> None:
    if not isinstance(value, torch.Tensor) or value.dtype != dtype \
            or not fits(value.shape, arg.shape):
        raise ABIError(f"{kernel}: argument {arg.name} does not match "
                       f"{arg.dtype} {fmt_shape(arg.shape)}")


def _check_block_ids(kernel: KernelABI, named: dict[str, object]) -> None:
    """Every block id is -1 (the scratch page) or names one of the pool's real pages."""
    for name, table in named.items():
        if not name.startswith("block_table_"):
            continue
        pages = named["pool_" + name.removeprefix("block_table_")].shape[2] - 1
        if table.numel() and (int(table.min()) < -1 or int(table.max()) >= pages):
            raise ABIError(f"{kernel.name}: {name} holds ids outside [-1, {pages})")


def _check_row_lens(kernel: KernelABI, named: dict[str, object]) -> None:
    """Valid rows per slot or batch row lie in [0, the rows the launch carries]."""
    for name, ref in _ROW_BOUNDS.items():
        if name in named:
            lens, bound = named[name], named[ref].shape[-1]
            if lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > bound):
                raise ABIError(f"{kernel.name}: {name} must lie in [0, {bound}]")
