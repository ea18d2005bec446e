"""The peak of the memory a piece of code allocates, counted op by op: works on fake
tensors, which have sizes and no memory.

Every tensor an op returns is looked up by its storage: a storage not seen before is an
allocation of its bytes, and its garbage collection a free; a view shares a storage seen
already. Storages that exist before (weights, pools, buffers) are declared `known` and
count nothing, even when an op returns a view of them.

torch.distributed's MemTracker measures the same (tests/runtime/test_rehearsal.py holds
them equal on a launch) and more (per module, per kind of reference); this keeps only the
peak, at a third of its cost per op, which is what lets a V4-Flash prefill of 8,192 tokens
per slot run here in minutes.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


class PeakTracker(TorchDispatchMode):
    """Within: `live` bytes allocated by ops and not yet freed, and their `peak`."""

    def __init__(self, known: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.live = self.peak = 0
        self._seen = WeakIdKeyDictionary()       # storage -> its weakref, or None (known)
        for t in known:
            self._seen[t.untyped_storage()] = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        if storage in self._seen:
            return
        size = storage.nbytes()
        self._seen[storage] = weakref.ref(storage, lambda _: self._free(size))
        self.live += size
        self.peak = max(self.peak, self.live)

    def _free(self, size: int) -> None:
        self.live -= size
