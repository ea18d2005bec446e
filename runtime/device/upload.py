"""Host data onto the device: the runner's host-to-device transfers go through `upload`,
one host tensor and one copy, so that a dispatch mode sees each transfer
(`torch.tensor(data, device=...)` copies out of its sight) and `Uploads` can count the
bytes a step sends (the sampling state, a layer below, copies its host arrays with
`.to(device)`, which it sees as well)."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


def upload(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`data` (a list, nested lists or an ndarray) as a tensor on `device`."""
    host = torch.from_numpy(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) \
        else torch.tensor(data)
    return host.to(device=device, dtype=dtype or host.dtype, non_blocking=True)


class Uploads(TorchDispatchMode):
    """Counts the bytes copied from host tensors to another device while active: uploads
    (`upload`) and the launchers' staging copies (`copy_` from host arrays)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _COPIES:
            src = args[0] if func is _COPIES[0] else args[1]
            dst = out
            if src.device.type == "cpu" and dst.device.type != "cpu":
                self.bytes += src.numel() * src.element_size()
        return out
