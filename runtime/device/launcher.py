"""Launcher: one kernel specialization made a launch, from its ABI table.

A spec's generated package declares each kernel as data (contract.abi.KernelABI: the
arguments in launch order, their roles, dtypes and shapes); a Launcher turns that table
into a launch: it allocates the staging and output buffers once, checks and stages every
argument by its role, and hands the backend the arguments by name. The checks read the
same for every spec and every kernel; nothing here knows a spec.
"""
from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, KeysView
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

# The argument whose host value says which rows of a launch carry work, by kernel kind.
_LIVE_BY = {"decode": ("row_lens", 0), "decode_mtp": ("slot_ids", -1),
            "prefill_main": ("chunk_lens", 0), "prefill_mtp": ("num_rows", 0)}


@cache
def args_type(kernel: KernelABI) -> type:
    """The named tuple a backend receives: every argument by name, then `host` (the
    staged metadata given as host data, for decisions a backend makes before launching;
    metadata given as device tensors has none) and `live` (the flat indices rank * rows
    + row of the rows that carry work, ascending)."""
    return namedtuple(f"{kernel.class_name}Args",
                      [a.name for a in kernel.args] + ["host", "live"])


def live_rows(kernel: KernelABI, host: dict[str, np.ndarray]) -> np.ndarray:
    """The live rows from the host metadata, for a caller that does not know them."""
    name, empty = _LIVE_BY[kernel.kind]
    return np.flatnonzero(host[name].reshape(-1) > empty)


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
        # What marshal() does per argument, in launch order, decided once.
        self._steps = tuple(self._step(a) for a in kernel.args)
        self._dynamic = kernel.dynamic_extent
        self._keywords = frozenset(_keyword(a) for a in kernel.args if a.role != "output")
        self._host = tuple(a.name for a in kernel.args if a.staged and a.role == "metadata")
        self._args, self._outputs = args_type(kernel), outputs_type(kernel)

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

    def _step(self, arg: Arg) -> Callable[[dict[str, Any], int | None], Any]:
        """How one argument becomes what the backend receives, by its role."""
        if arg.staged:
            buf = self.buffers[arg.name]
            if EXTENT in arg.shape:              # the launch's rows of a max-extent buffer
                dim = arg.shape.index(EXTENT)
                return lambda given, extent: stage(buf.narrow(dim, 0, extent),
                                                   given[arg.name], arg)
            return lambda given, extent: stage(buf, given[arg.name], arg)
        if arg.role in ("input", "pool"):
            dtype, shape = torch_dtype(arg.dtype), self._shape(arg)
            owner, _, field = arg.source.partition(".")
            pick = (lambda given: getattr(given[owner], field)) if field \
                else (lambda given: given[owner])
            return lambda given, extent: check_tensor(pick(given), arg, dtype, shape,
                                                      self.device)
        if arg.role == "weight":
            kernel = self.kernel
            return lambda given, extent: check_weights(given[arg.name], kernel.fingerprint,
                                                       kernel.spec)
        if arg.name == EXTENT:
            return lambda given, extent: extent
        if arg.role == "scalar":
            return lambda given, extent: given[arg.name]
        buf = self.buffers[arg.name]
        return lambda given, extent: buf

    def _shape(self, arg: Arg) -> tuple[int | None, ...]:
        """A passed-through argument's shape: this launcher's ranks in front, None for a
        pool's block count (fixed when the pools were allocated)."""
        dims = {RANKS: self.ranks, BLOCKS: None}
        return tuple(dims.get(d, d) for d in arg.shape)

    def marshal(self, live: np.ndarray | None = None, **given: Any) -> tuple:
        """Check and stage every argument; return the launch's named arguments. `live`:
        the rows that carry work, as flat indices (the runner knows them); None derives
        them from the host metadata."""
        if given.keys() != self._keywords:
            raise TypeError(_keyword_error(self.kernel, self._keywords, given.keys()))
        extent = check_extent(given[EXTENT], self.kernel.tile, self.kernel.max_extent) \
            if self._dynamic else None
        host = {name: np.asarray(given[name]) for name in self._host
                if not isinstance(given[name], torch.Tensor)}
        if live is None:
            live = live_rows(self.kernel, host)
        return self._args(*(step(given, extent) for step in self._steps), host, live)

    def launch(self, live: np.ndarray | None = None, **given: Any) -> tuple | None:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(live, **given))

    def run(self, args: tuple) -> tuple | None:
        """Run the kernel on arguments marshal() built; the outputs' views (None for a
        kernel without outputs)."""
        self.backend.launch(self.kernel, args)
        return self._outputs(*(self.buffers[name] for name in self._outputs._fields)) \
            if self._outputs._fields else None


def _keyword_error(kernel: KernelABI, expected: frozenset[str], given: KeysView) -> str:
    """What is wrong with marshal()'s keywords: the ones missing, the ones unexpected."""
    missing, extra = sorted(expected - given), sorted(given - expected)
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
        ([f"unexpected {', '.join(extra)}"] if extra else [])
    return f"{kernel.class_name}.marshal(): {'; '.join(parts)}"


def _keyword(arg: Arg) -> str:
    """The marshal() keyword an argument comes from (a pool's is `pools`)."""
    return arg.source.partition(".")[0]
