"""DeepSeek V4.1's served entry formats: the release's quantize-dequantize sites, applied to
a whole row (RoPE part included, no Hadamard rotation), as stored bytes (V41.md 3.8).

    fp8_32   window KV       e4m3 values, per 32 a power-of-two scale      width + width/32
                             2^ceil(log2(max(amax, 1e-4) * fp32(1/448)))    (e8m0 bytes)
    fp4_16   compressed KV   e2m1 codes two a byte (low nibble first), per  width/2 + width/16
                             16 an e4m3 scale e4m3(max(amax, 6*2^-9) / 6)
    fp4_32   index keys      e2m1 codes, per 32 a power-of-two scale        width/2 + width/32
             and queries     2^ceil(log2(max(amax, 6*2^-126) * fp32(1/6)))  (e8m0 bytes)

A value is its code (clamped to +-448 / +-6, rounded to the nearest code: e4m3 by the
cast, e2m1 with ties to the even code, the sign kept even on zero) times its scale.
"""
from __future__ import annotations

import torch

from runtime.model.quant import e2m1_values

FORMATS = ("fp8_32", "fp4_16", "fp4_32")
FP8_MAX, FP4_MAX = 448.0, 6.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def encode(name: str, values: torch.Tensor) -> list[torch.Tensor]:
    """values [..., width] float32 -> the row's byte parts (codes, then scales)."""
    if name == "fp8_32":
        blocks = _blocks(values, 32)
        exponent = _ceil_log2(blocks.abs().amax(-1).clamp(min=1e-4) * _f32(1 / FP8_MAX))
        scaled = (blocks / torch.exp2(exponent)[..., None]).clamp(-FP8_MAX, FP8_MAX)
        codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).flatten(-2)
        return [codes, (exponent + 127).to(torch.uint8)]
    if name == "fp4_16":
        blocks = _blocks(values, 16)
        scale = (blocks.abs().amax(-1).clamp(min=FP4_MAX * 2.0 ** -9) / FP4_MAX)
        scale = scale.to(torch.float8_e4m3fn)
        codes = _e2m1_codes(blocks / scale.float()[..., None])
        return [_pack(codes), scale.view(torch.uint8)]
    blocks = _blocks(values, 32)
    exponent = _ceil_log2(blocks.abs().amax(-1).clamp(min=FP4_MAX * 2.0 ** -126)
                          * _f32(1 / FP4_MAX))
    codes = _e2m1_codes(blocks / torch.exp2(exponent)[..., None])
    return [_pack(codes), (exponent + 127).to(torch.uint8)]


def decode(name: str, stored: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Stored rows [..., bytes] -> values [..., width] in `dtype` (float32 or bfloat16:
    a code times its scale is exact in either)."""
    lead = stored.shape[:-1]
    if name == "fp8_32":
        values = stored[..., :width].view(torch.float8_e4m3fn).to(dtype)
        scales = _exp2(stored[..., width:width + width // 32]).to(dtype)
        return (values.view(*lead, width // 32, 32) * scales[..., None]).view(*lead, width)
    half = width // 2
    pairs = _e2m1_pairs(dtype, stored.device)[stored[..., :half].long()]   # [..., half, 2]
    values = pairs.view(*lead, width)
    group = 16 if name == "fp4_16" else 32
    scale_bytes = stored[..., half:half + width // group]
    if name == "fp4_16":
        scales = scale_bytes.contiguous().view(torch.float8_e4m3fn).to(dtype)
    else:
        scales = _exp2(scale_bytes).to(dtype)
    return (values.view(*lead, width // group, group) * scales[..., None]).view(*lead, width)


def _blocks(values: torch.Tensor, size: int) -> torch.Tensor:
    return values.float().view(*values.shape[:-1], values.shape[-1] // size, size)


def _f32(x: float) -> float:
    """x rounded to float32, as the release's constants are."""
    return torch.tensor(x, dtype=torch.float32).item()


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) of positive float32 x, exactly: x = m * 2^e with m in [0.5, 1)."""
    mantissa, exponent = torch.frexp(x)
    return (exponent - (mantissa == 0.5).int()).float()


def _e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """The nearest e2m1 code (0..15, bit 3 the sign) of values within +-6; a value halfway
    between two codes takes the even one."""
    magnitude = scaled.clamp(-FP4_MAX, FP4_MAX).abs()
    grid = torch.tensor(_E2M1, device=scaled.device)
    mids = (grid[1:] + grid[:-1]) / 2
    low = torch.bucketize(magnitude, mids)                 # halfway: the smaller code
    high = torch.bucketize(magnitude, mids, right=True)    # halfway: the larger
    code = torch.where(low % 2 == 0, low, high)
    return code + 8 * torch.signbit(scaled).long()


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., blocks, size] -> bytes [..., blocks * size / 2], low nibble first."""
    flat = codes.flatten(-2).to(torch.uint8)
    return flat[..., 0::2] | (flat[..., 1::2] << 4)


def _e2m1_pairs(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the two e2m1 values of each byte (low nibble first)."""
    byte = torch.arange(256, device=device)
    return torch.stack((e2m1_values(byte & 15), e2m1_values(byte >> 4)), -1).to(dtype)


def _exp2(scales: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes -> float32 powers of two."""
    return torch.exp2(scales.float() - 127.0)
