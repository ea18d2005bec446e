"""DecodeLayout: one fixed decode specialization of a spec. Torch-free, so that codegen
(which resolves layouts) and the generated contracts (which list them) share it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeLayout:
    """`batch` rows of `seq` = k + 1 tokens per rank, launched as the kernel `kernel`."""

    k: int
    batch: int
    seq: int
    kernel: str

    @classmethod
    def of(cls, k: int, batch: int, seq: int) -> DecodeLayout:
        """The layout with its kernel's conventional name, decode_b{batch}s{seq}."""
        return cls(k, batch, seq, f"decode_b{batch}s{seq}")
