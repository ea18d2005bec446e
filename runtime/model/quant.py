"""Weights held as the release stores them, dequantized where a kernel reads them.

    FP8   data  [..., out, in]      float8_e4m3fn
          scale [..., ceil(out/128), ceil(in/128)]   one per 128x128 block (V4; V4.1's
                                                     blocks are 32x32), or
                [..., out, ceil(in/128)]             one per row and 128 inputs (a fused
                                                     stack whose parts are not 128-aligned)
    FP4   data  [..., out, in/2]    uint8, two e2m1 codes per byte, low nibble first
          scale [..., out, in/32]   one per 32 inputs

Scales are e8m0 (uint8 exponents: 2^(e - 127)) or float32. A quantized tensor sits in a
weights dict under its own name with its scale under `scale_name(name)`; an unquantized
one has no scale. Dequantization is the same arithmetic everywhere (float32 product of
the code's value and its scale, then the compute dtype), so a weight dequantized in a
kernel equals the one the loader dequantizes when asked to (`weights.format`: a dtype).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from contract.checkpoint_layout import FP4_GROUP, FP8_BLOCK, STACK_CHUNK, V41_FP8_BLOCK

FP8 = torch.float8_e4m3fn
FP4 = torch.uint8               # packed pairs of e2m1 codes


def scale_name(name: str) -> str:
    """"layers.0.attn.wq_a.weight" -> "layers.0.attn.wq_a.scale" (the release's naming);
    a fused stack "fused.x" -> "fused.x.scale"."""
    return name.removesuffix(".weight") + ".scale"


def is_quantized(t: torch.Tensor) -> bool:
    return t.dtype in (FP8, FP4)


def scale_values(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 exponents (uint8) or float scales -> float32 multipliers."""
    if scale.dtype == torch.uint8:
        return torch.exp2(scale.float() - 127.0)
    return scale.float()


def dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A quantized tensor (FP8 or packed FP4, any leading dims) in `dtype`.

    An e8m0 scale is a power of two and every e4m3 / e2m1 value fits the mantissa of
    bfloat16 and float32, whose exponent range is float32's: there the product is
    computed in `dtype` itself, exact, hence equal to the float32 product rounded to
    `dtype`, without float32 temporaries. A float scale, or float16 (whose range a scale
    can leave), multiplies in float32 and the product is rounded once."""
    exact = scale.dtype == torch.uint8 and dtype in (torch.bfloat16, torch.float32)
    work = dtype if exact else torch.float32
    scale = scale_values(scale).to(work)
    values = _fp8(data, scale, work) if data.dtype == FP8 else _fp4(data, scale, work)
    return values.to(dtype)


def fp8_block(out: int, inp: int, scale_shape: tuple[int, ...]) -> int:
    """The side of the blocks an FP8 weight [out, inp]'s scale covers, from the scale's
    shape: V4's 128 or V4.1's 32 (64 is accepted too). Where several fit, every one of
    them dequantizes alike (a dimension within one block of each)."""
    rows, cols = scale_shape[-2:]
    for block in (V41_FP8_BLOCK, 64, FP8_BLOCK):
        if -(-inp // block) == cols and rows in (out, -(-out // block)):
            return block
    raise ValueError(f"an FP8 weight [{out}, {inp}] with scales {tuple(scale_shape)}: no "
                     f"block of {V41_FP8_BLOCK}, 64 or {FP8_BLOCK} fits")


def _fp8(data: torch.Tensor, scale: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    out, inp = data.shape[-2:]
    block = fp8_block(out, inp, scale.shape)
    if scale.shape[-2] != out:                       # block scales: one per `block` rows
        scale = scale.repeat_interleave(block, -2)[..., :out, :]
    values = data.to(work)                           # a new tensor: scaled in place
    if inp % block:
        return values.mul_(scale.repeat_interleave(block, -1)[..., :inp])
    blocks = values.view(*values.shape[:-1], inp // block, block)
    return blocks.mul_(scale[..., None]).view(values.shape)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (0..15, bit 3 the sign) -> float32: 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    exponent, mantissa = (codes >> 1) & 3, (codes & 1).float()
    magnitude = torch.where(exponent == 0, 0.5 * mantissa,
                            torch.exp2(exponent.float() - 1) * (1 + 0.5 * mantissa))
    return torch.where(codes >= 8, -magnitude, magnitude)


def _fp4(packed: torch.Tensor, scale: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """Each byte looked up as its pair of values (a 256-row table), then scaled per 32."""
    nibble = e2m1_values(torch.arange(16, device=packed.device))
    # byte b -> (nibble[b % 16], nibble[b // 16]): low nibble first
    pairs = torch.stack((nibble.repeat(16), nibble.repeat_interleave(16)), -1).to(work)
    values = F.embedding(packed.int(), pairs)                   # [..., out, in/2, 2]
    groups = values.view(*packed.shape[:-1], -1, FP4_GROUP)     # [..., out, in/32, 32]
    return groups.mul_(scale[..., None]).view(*packed.shape[:-1], -1)


def weight(p: Mapping[str, torch.Tensor], name: str, dtype: torch.dtype) -> torch.Tensor:
    """The matrix `name` of p in `dtype`, dequantized if the device holds it quantized."""
    data = p[name]
    return dequantize(data, p[scale_name(name)], dtype) if is_quantized(data) else data


def linear(x: torch.Tensor, p: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """x @ p[name]^T, the weight dequantized on the fly into x's dtype."""
    return F.linear(x, weight(p, name, x.dtype))


def stacks(held: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A layer's routed experts (w13, w2) in `dtype` from what the device holds: the two
    stacks, or the two packed stacks and their two scales."""
    return stack(held, 0, dtype), stack(held, 1, dtype)


def stack(held: tuple[torch.Tensor, ...], which: int, dtype: torch.dtype,
          rows: slice = slice(None)) -> torch.Tensor:
    """One of a layer's routed expert stacks (0: w13, 1: w2) in `dtype`, or the output
    `rows` of it (w13's w1 or w3 half)."""
    if len(held) == 2:
        return held[which][:, rows]
    return _stack(held[which][:, rows], held[which + 2][:, rows], dtype)


def _stack(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A stack [n, out, in] dequantized a few experts at a time into one tensor: the
    temporaries are STACK_CHUNK experts' at a time, not the whole stack's."""
    inputs = data.shape[-1] * (2 if data.dtype == FP4 else 1)
    out = torch.empty((*data.shape[:-1], inputs), dtype=dtype, device=data.device)
    for i in range(0, data.shape[0], STACK_CHUNK):
        part = slice(i, i + STACK_CHUNK)
        out[part] = dequantize(data[part], scale[part], dtype)
    return out


def row_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """FP8 block scales [ceil(rows/128), C] -> one per row [rows, C] (for stacking)."""
    return scale if scale.shape[0] == rows else \
        scale.repeat_interleave(FP8_BLOCK, 0)[:rows]
