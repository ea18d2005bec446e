"""One transformer block: attention, then MoE, each inside the mHC pattern."""
from __future__ import annotations

import torch

from runtime.model.attention import attention
from runtime.model.hyper import hc_post, hc_pre
from runtime.model.moe import moe
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
