"""Launcher: one kernel specialization's launch wrapper, built from its ABI table.

A spec's generated package declares each kernel as data (contract.abi.KernelABI: the
arguments in launch order, their roles, dtypes and shapes); a Launcher turns that table
into a launch: it allocates the staging and output buffers once, checks and stages every
argument by its role, and hands the backend the arguments by name. The checks read the
same for every spec and every kernel; nothing here knows a spec.
"""
from __future__ import annotations

from collections import namedtuple
from functools import cache
from typing import Any

import numpy as np
import torch

from contract.abi import BLOCKS, EXTENT, RANKS, Arg, KernelABI
from runtime.backends import Backend, get_backend
from runtime.backends.arg_checks import (
    check_extent,
    check_tensor,
    check_weights,
    stage,
    torch_dtype,
)


@cache
def args_type(kernel: KernelABI) -> type:
    """The named tuple a backend receives: every argument by name, then `host` (host
    copies of the staged metadata, for decisions a backend makes before launching)."""
    return namedtuple(f"{kernel.class_name}Args", [a.name for a in kernel.args] + ["host"])


@cache
def outputs_type(kernel: KernelABI) -> type:
    """The named tuple of a launch's outputs: views of the launcher's output buffers,
    valid until its next launch."""
    return namedtuple(f"{kernel.class_name}Outputs", [a.name for a in kernel.by_role("output")])


class Launcher:
    """Stage, check and launch one kernel through a backend.

    Staging and output buffers are allocated once here and reused by every launch;
    `ranks` is how many ranks of the replica this launcher drives (all of them in one
    process, one in a rank worker).
    """

    def __init__(self, kernel: KernelABI, device: str | torch.device = "cpu",
                 backend: str | None = None, ranks: int | None = None):
        self.kernel, self.device = kernel, torch.device(device)
        self.ranks = kernel.ranks if ranks is None else ranks
        self.backend: Backend = get_backend(backend or kernel.backend)
        self.buffers = {a.name: self._zeros(a) for a in kernel.args
                        if a.staged or a.role == "output"}

    def _zeros(self, arg: Arg) -> torch.Tensor:
        dims = {RANKS: self.ranks, EXTENT: self.kernel.max_extent}
        return torch.zeros(tuple(dims.get(d, d) for d in arg.shape),
                           dtype=torch_dtype(arg.dtype), device=self.device)

    def __getattr__(self, name: str) -> torch.Tensor:
        """A staging or output buffer by its argument's name (launcher.logits)."""
        buffers = self.__dict__.get("buffers", {})
        if name in buffers:
            return buffers[name]
        raise AttributeError(f"{type(self).__name__} of {self.kernel.name} has no {name!r}")

    def marshal(self, **given: Any) -> tuple:
        """Check and stage every argument; return the launch's named arguments."""
        kernel = self.kernel
        expected = {a.name for a in kernel.args if a.role in ("input", "metadata", "scalar")}
        expected |= {a.source.split(".")[0] for a in kernel.args if a.role in ("pool", "weight")}
        _check_keywords(kernel, expected, given)
        extent = check_extent(given["extent"], kernel.tile, kernel.max_extent) \
            if kernel.dynamic_extent else None
        values = {a.name: self._value(a, given, extent) for a in kernel.args}
        host = {a.name: np.asarray(given[a.name]) for a in kernel.args
                if a.staged and a.role == "metadata"}
        return args_type(kernel)(**values, host=host)

    def _value(self, arg: Arg, given: dict[str, Any], extent: int | None) -> Any:
        """One argument as the backend receives it, by its role."""
        if arg.staged:
            buf = self.buffers[arg.name]
            return stage(buf[:, :, :extent] if EXTENT in arg.shape else buf, given[arg.name], arg)
        if arg.role in ("input", "pool"):
            return check_tensor(_source(arg, given), arg, self._shape(arg), self.device)
        if arg.role == "weight":
            return check_weights(given["weights"], self.kernel.fingerprint, self.kernel.spec)
        if arg.role == "scalar":
            return extent if arg.name == EXTENT else given[arg.name]
        return self.buffers[arg.name]

    def _shape(self, arg: Arg) -> tuple[int | None, ...]:
        """A passed-through argument's shape: this launcher's ranks in front, None for a
        pool's block count (fixed when the pools were allocated)."""
        dims = {RANKS: self.ranks, BLOCKS: None}
        return tuple(dims.get(d, d) for d in arg.shape)

    def launch(self, **given: Any) -> tuple | None:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**given))

    def run(self, args: tuple) -> tuple | None:
        """Run the kernel on arguments marshal() built; the outputs' views (None for a
        kernel without outputs)."""
        self.backend.launch(self.kernel, args)
        outputs = self.kernel.by_role("output")
        if not outputs:
            return None
        return outputs_type(self.kernel)(*(self.buffers[a.name] for a in outputs))


def _check_keywords(kernel: KernelABI, expected: set[str], given: dict[str, Any]) -> None:
    missing, extra = sorted(expected - set(given)), sorted(set(given) - expected)
    if missing or extra:
        raise TypeError(f"{kernel.name}.marshal(): missing {missing}, unexpected {extra}")


def _source(arg: Arg, given: dict[str, Any]) -> Any:
    """A passed-through tensor: its keyword's value, or a field of one (pools.ori)."""
    owner, _, field = arg.source.partition(".")
    value = given[owner]
    return getattr(value, field) if field else value
