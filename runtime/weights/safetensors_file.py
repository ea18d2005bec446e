"""A safetensors file read one tensor at a time into memory of its own, never mapped.

safetensors' `safe_open` maps the whole file: every page a read touches stays in the
process's resident set until the file is closed, so loading a checkpoint through it
peaks at the weights plus the whole file. Here a tensor is read with pread(2) into a
fresh buffer: the host holds the tensor being loaded and nothing else of the file.

The header (format, checks) is contract/safetensors_header.py's, read without torch.
"""
from __future__ import annotations

import functools
import os

import torch

from contract.safetensors_header import SafetensorsError, SafetensorsHeader

__all__ = ["SafetensorsError", "SafetensorsFile", "stored_dtype"]


@functools.cache
def stored_dtype(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (F32, BF16, F8_E4M3, ...)."""
    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
            "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
            "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
            "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
            "F8_E8M0": torch.float8_e8m0fnu}[name]


class SafetensorsFile(SafetensorsHeader):
    """A safetensors file whose tensors are read one at a time, each into memory of its
    own."""

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name`, in memory of its own (host, as stored)."""
        offset, length = self.span(name)
        buffer = torch.empty(length, dtype=torch.uint8)
        view, done = memoryview(buffer.numpy()), 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                raise SafetensorsError(f"{self.path}: truncated in tensor {name}")
            done += got
        return buffer.view(stored_dtype(self.dtype(name))).view(self.shape(name))
