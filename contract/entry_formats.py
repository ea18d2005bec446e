"""Pool entry formats as sizes: what one stored row of a pool group takes, by the format
the spec declares for the group (the runtime's codecs: runtime/model/entry_format.py).

V4's formats:

    compute   the row's values in the group's dtype            width x dtype bytes
    fp8_ds    V4's served main entry: the non-RoPE values FP8   nope + 2 rope + nope / 64,
              e4m3 in blocks of 64 with one e8m0 scale byte     padded to 8 bytes (584
              each, the RoPE part bfloat16                      at 512 wide, 64 RoPE)
    fp8       FP8 e4m3 values and one float32 scale a row       width + 4
              (indexer keys, Hadamard-rotated)
    fp4       FP4 e2m1 codes, two a byte, and one e8m0 scale     width / 2 + width / 32
              byte per 32 values (indexer keys, Hadamard-rotated)

V4.1's served formats quantize the whole row, RoPE part included, and rotate nothing:

    fp8_32    FP8 e4m3 values, a power-of-two (e8m0) scale      width + width / 32
              byte per 32 (window KV)                           (528 at 512)
    fp4_16    FP4 e2m1 codes, two a byte, an e4m3 scale byte    width / 2 + width / 16
              per 16 (compressed KV)                            (288 at 512)
    fp4_32    FP4 e2m1 codes, two a byte, a power-of-two        width / 2 + width / 32
              (e8m0) scale byte per 32 (index keys)             (68 at 128)
"""
from __future__ import annotations

FORMATS = ("compute", "fp8_ds", "fp8", "fp4", "fp8_32", "fp4_16", "fp4_32")
FP8_BLOCK = 64          # values per scale of an fp8_ds entry
FP4_BLOCK = 32          # values per scale of an fp4 entry

# values per scale byte of each V4.1 format (a row's width must be a multiple)
SCALE_BLOCK = {"fp8_32": 32, "fp4_16": 16, "fp4_32": 32}


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
    if name in SCALE_BLOCK:
        values = width if name.startswith("fp8") else width // 2
        return values + width // SCALE_BLOCK[name]
    raise ValueError(f"unknown entry format {name!r}: one of {', '.join(FORMATS)}")
