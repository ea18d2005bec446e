"""mHC hyper-connections: hc_mult residual streams mixed around every sub-layer.

    mixes = (flat(x) @ fn.T) / rms(flat(x))            flat(x): [T, hc*d] in float32
    pre   = sigmoid(mixes[:hc] * s0 + base[:hc]) + eps
    post  = 2 * sigmoid(mixes[hc:2hc] * s1 + base[hc:2hc])
    comb  = Sinkhorn(softmax(mixes[2hc:] * s2 + base[2hc:]) + eps)     [hc, hc]
    y     = sum_i pre_i x_i                            the sub-layer's input
    out_j = post_j * f(y) + sum_i comb[i, j] x_i

V4 collapses a sub-layer's input with its own pre (`hc_pre`). V4.1 is single-pass: a
sub-layer's `mix` gives post and comb for itself but its pre collapses the *next*
sub-layer's input (the first layer's attention reads a one-hot pre, stream 0; the final
collapse uses the last FFN's pre, and there is no hc_head).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _mixes(x: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    flat = x.flatten(-2).float()                                       # [T, hc*d]
    return F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def mix(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
        norm_eps: float, hc_eps: float, sinkhorn_iters: int):
    """x [T, hc, d] -> (pre [T, hc], post [T, hc], comb [T, hc, hc]), float32."""
    hc = x.shape[-2]
    mixes = _mixes(x, fn, norm_eps)
    base, scale = base.float(), scale.float()
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]
    comb = torch.softmax(logits.view(-1, hc, hc), dim=-1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    return pre, post, comb


def collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_i pre_i x_i in float32: x [T, hc, d], pre [T, hc] -> [T, d] in x's dtype."""
    return (pre.unsqueeze(-1) * x.float()).sum(-2).to(x.dtype)


def one_hot_pre(tokens: int, hc: int, device: torch.device) -> torch.Tensor:
    """The pre [T, hc] a V4.1 model's first sub-layer collapses with: stream 0."""
    pre = torch.zeros(tokens, hc, device=device)
    pre[:, 0] = 1.0
    return pre


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
           norm_eps: float, hc_eps: float, sinkhorn_iters: int):
    """V4: x [T, hc, d] -> (y [T, d], post [T, hc], comb [T, hc, hc]), y collapsed with
    the mix's own pre."""
    pre, post, comb = mix(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters)
    return collapse(x, pre), post, comb


def hc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor,
            comb: torch.Tensor) -> torch.Tensor:
    """out_j = post_j * f + sum_i comb[i, j] x_i; f [T, d], x [T, hc, d]."""
    mixed = torch.einsum("tij,tid->tjd", comb.to(x.dtype), x)
    return post.to(x.dtype).unsqueeze(-1) * f.unsqueeze(-2) + mixed


def hc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
            norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Collapse the streams before the final norm: pre-style weights, no Sinkhorn."""
    mixes = _mixes(x, fn, norm_eps)
    pre = torch.sigmoid(mixes * scale.float() + base.float()) + hc_eps
    return (pre.unsqueeze(-1) * x.float()).sum(-2).to(x.dtype)
