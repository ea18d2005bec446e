"""One transformer block: attention, then MoE, each inside the mHC pattern (V4's, and
V4.1's single-pass one)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.model.attention import attention
from runtime.model.hyper import collapse, hc_post, hc_pre, mix
from runtime.model.moe import clamped_moe, moe
from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams


def block(params: ModelParams, layer: int, h: torch.Tensor, ids: torch.Tensor,
          pos: torch.Tensor, segments: list[Segment], view: PoolView, tile: int) -> torch.Tensor:
    """h [T, hc, dim] -> h [T, hc, dim] through layer `layer` (main or MTP)."""
    args, p = params.args, params.layer(layer)
    inv_freq = params.rope.table(args.kind(layer) in ("csa", "hca"))
    mix = (args.norm_eps, args.hc_eps, args.hc_sinkhorn_iters)
    y, post, comb = hc_pre(h, p["hc_attn_fn"], p["hc_attn_base"], p["hc_attn_scale"], *mix)
    x = rms_norm(y, p["attn_norm.weight"], args.norm_eps)
    h = hc_post(attention(p, args, layer, x, pos, segments, view, inv_freq, tile), h, post, comb)
    y, post, comb = hc_pre(h, p["hc_ffn_fn"], p["hc_ffn_base"], p["hc_ffn_scale"], *mix)
    x = rms_norm(y, p["ffn_norm.weight"], args.norm_eps)
    experts = tuple(params.rank_experts(layer, rank) for rank in range(params.ranks))
    out = moe(p, args, args.is_hash(layer), experts, x, ids)
    return hc_post(out, h, post, comb)


def single_pass_block(params: ModelParams, layer: int, h: torch.Tensor, pre: torch.Tensor,
                      attention: Callable[[torch.Tensor], torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """V4.1: h [T, hc, dim] and the pre [T, hc] handed in -> (h, the FFN mix's pre, which
    collapses the next layer's attention input). Each mix's post and comb act at once;
    its pre collapses the next sub-layer's input (runtime/model/hyper.py). `attention`
    maps the normed input [T, dim] to the sub-layer's output: a backbone layer's CSA2
    attention (runtime/model/csa2.py) or a DSpark stage's (runtime/model/dspark.py)."""
    args, p = params.args, params.layer(layer)
    mixing = (args.norm_eps, args.hc_eps, args.hc_sinkhorn_iters)
    attn_pre, post, comb = mix(h, p["hc_attn_fn"], p["hc_attn_base"], p["hc_attn_scale"],
                               *mixing)
    x = rms_norm(collapse(h, pre), p["attn_norm.weight"], args.norm_eps)
    h = hc_post(attention(x), h, post, comb)
    ffn_pre, post, comb = mix(h, p["hc_ffn_fn"], p["hc_ffn_base"], p["hc_ffn_scale"], *mixing)
    x = rms_norm(collapse(h, attn_pre), p["ffn_norm.weight"], args.norm_eps)
    experts = tuple(params.rank_experts(layer, rank) for rank in range(params.ranks))
    return hc_post(clamped_moe(p, args, layer, experts, x), h, post, comb), ffn_pre
