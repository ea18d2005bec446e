"""Pool entry formats as sizes: what one stored row of a pool group takes, by the format
the spec declares for the group (the runtime's codecs: runtime/model/entry_format.py).

    compute   the row's values in the group's dtype            width x dtype bytes
    fp8_ds    V4's served main entry: the non-RoPE values FP8   nope + 2 rope + nope / 64,
              e4m3 in blocks of 64 with one e8m0 scale byte     padded to 8 bytes (584
              each, the RoPE part bfloat16                      at 512 wide, 64 RoPE)
    fp8       FP8 e4m3 values and one float32 scale a row       width + 4
    fp4       FP4 e2m1 codes, two a byte, and one e8m0 scale     width / 2 + width / 32
              byte per 32 values
"""
from __future__ import annotations

FORMATS = ("compute", "fp8_ds", "fp8", "fp4")
FP8_BLOCK = 64          # values per scale of an fp8_ds entry
FP4_BLOCK = 32          # values per scale of an fp4 entry


def entry_bytes(name: str, width: int, rope: int, dtype_bytes: int) -> int:
    """Bytes one row of `width` values (the last `rope` the RoPE part) takes in format
    `name`."""
    if name == "compute":
        return width * dtype_bytes
    if name == "fp8_ds":
        nope = width - rope
        return -(-(nope + 2 * rope + nope // FP8_BLOCK) // 8) * 8
    if name == "fp8":
        return width + 4
    if name == "fp4":
        return width // 2 + width // FP4_BLOCK
    raise ValueError(f"unknown entry format {name!r}: one of {', '.join(FORMATS)}")
