"""Interleaved partial RoPE on the trailing `rope_dim` channels.

Consecutive channel pairs (2i, 2i+1) of the rope slice rotate by angle pos * inv_freq[i].
Sliding-only layers use rope_theta; compressed (CSA/HCA) layers use compress_rope_theta
with YaRN frequency blending and no attention-scale factor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from contract.model_args import ModelArgs


def plain_inv_freq(rope_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))


def yarn_inv_freq(rope_dim: int, theta: float, factor: float, original_max: int,
                  beta_fast: float, beta_slow: float) -> torch.Tensor:
    """YaRN: extrapolate fast-rotating pairs, interpolate (divide by factor) slow ones,
    with a linear ramp between the correction dimensions of beta_fast and beta_slow."""

    def correction_dim(rotations: float) -> float:
        turns = original_max / (rotations * 2 * math.pi)
        return rope_dim * math.log(turns) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = plain_inv_freq(rope_dim, theta)
    keep = 1 - ramp  # share of the extrapolated (unscaled) frequency
    return extrapolated / factor * (1 - keep) + extrapolated * keep


@dataclass(frozen=True)
class Rope:
    """The two rotary tables of a model, keyed by whether a layer compresses."""

    main: torch.Tensor       # inv_freq [rope_dim/2] of sliding-only layers and MTP
    compress: torch.Tensor   # inv_freq [rope_dim/2] of CSA/HCA layers, their compressors, indexer
    rope_dim: int

    @classmethod
    def build(cls, args: ModelArgs, device: torch.device) -> Rope:
        compress = yarn_inv_freq(args.rope_dim, args.compress_rope_theta, args.yarn_factor,
                                 args.yarn_original_max, args.yarn_beta_fast, args.yarn_beta_slow)
        return cls(plain_inv_freq(args.rope_dim, args.rope_theta).to(device),
                   compress.to(device), args.rope_dim)

    def table(self, compressed: bool) -> torch.Tensor:
        return self.compress if compressed else self.main


def apply_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing 2*len(inv_freq) channels of x [T, ..., D] at positions pos [T].

    inverse=True rotates by -angle (undoes the rotation carried by V = K)."""
    rope_dim = 2 * inv_freq.shape[0]
    angle = pos.float()[:, None] * inv_freq[None, :]                    # [T, rope_dim/2]
    angle = angle.view(angle.shape[0], *([1] * (x.dim() - 2)), angle.shape[1])
    cos, sin = angle.cos(), angle.sin()
    if inverse:
        sin = -sin
    rot = x[..., -rope_dim:].float()
    even, odd = rot[..., 0::2], rot[..., 1::2]
    turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], turned.to(x.dtype)), dim=-1)
