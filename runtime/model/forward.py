"""The main model and the MTP block over a flat batch of segments.

Tokens of every segment of every rank are concatenated into one batch [T]: dense
projections and the MoE run on all of them at once; attention walks each segment
against its own request's pools.
"""
from __future__ import annotations

import torch

from runtime.model.attention import project_kv, write_window
from runtime.model.block import block
from runtime.model.hyper import hc_head, hc_pre
from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams
from runtime.model.quant import linear


def positions(segments: list[Segment], device: torch.device) -> torch.Tensor:
    """Position of every token of the flat batch [T]."""
    return torch.cat([torch.arange(s.start, s.end, device=device) for s in segments])


def main_model(params: ModelParams, ids: torch.Tensor, segments: list[Segment],
               view: PoolView, tile: int) -> torch.Tensor:
    """Token ids [T] -> pre-hc_head streams [T, hc, dim]; writes every layer's pools."""
    pos = positions(segments, ids.device)
    h = params["embed.weight"][ids]
    h = h.unsqueeze(1).expand(-1, params.args.hc_mult, -1).contiguous()
    for layer in range(params.args.n_layers):
        h = block(params, layer, h, ids, pos, segments, view, tile)
    return h


def logits(params: ModelParams, h: torch.Tensor, prefix: str = "") -> torch.Tensor:
    """Streams [N, hc, dim] -> float32 logits [N, vocab]: hc_head, norm, head.

    prefix "" is the main model's head; "mtp.K." the MTP block's own hc_head and norm
    (the output projection is the main model's head either way)."""
    args = params.args
    x = hc_head(h, params[prefix + "hc_head_fn"], params[prefix + "hc_head_base"],
                params[prefix + "hc_head_scale"], args.norm_eps, args.hc_eps)
    x = rms_norm(x, params[prefix + "norm.weight"], args.norm_eps)
    return linear(x, params, "head.weight").float()


def mtp_input(params: ModelParams, layer: int, h: torch.Tensor,
              next_ids: torch.Tensor) -> torch.Tensor:
    """e_proj(enorm(embed(next))) broadcast over the streams + h_proj(hnorm(h))."""
    args, p = params.args, params.layer(layer)
    e = rms_norm(params["embed.weight"][next_ids], p["enorm.weight"], args.norm_eps)
    e = linear(e, p, "e_proj.weight")
    hh = linear(rms_norm(h, p["hnorm.weight"], args.norm_eps), p, "h_proj.weight")
    return e.unsqueeze(1) + hh


def mtp_block(params: ModelParams, layer: int, h: torch.Tensor, next_ids: torch.Tensor,
              segments: list[Segment], view: PoolView, tile: int) -> torch.Tensor:
    """The MTP block at the positions of h: main streams [T, hc, dim] and the tokens
    after them -> the block's streams [T, hc, dim], whose logits draft position + 2."""
    pos = positions(segments, h.device)
    x = mtp_input(params, layer, h, next_ids)
    return block(params, layer, x, next_ids, pos, segments, view, tile)


def mtp_write_kv(params: ModelParams, layer: int, h: torch.Tensor, next_ids: torch.Tensor,
                 segments: list[Segment], view: PoolView) -> None:
    """Only the MTP layer's sliding KV for these positions: a key row depends on its own
    token's input alone, so rebuilding the window needs no attention or MoE."""
    args, p = params.args, params.layer(layer)
    pos = positions(segments, h.device)
    x = mtp_input(params, layer, h, next_ids)
    y, _, _ = hc_pre(x, p["hc_attn_fn"], p["hc_attn_base"], p["hc_attn_scale"],
                     args.norm_eps, args.hc_eps, args.hc_sinkhorn_iters)
    kv = project_kv(p, args, rms_norm(y, p["attn_norm.weight"], args.norm_eps), pos,
                    params.rope.main)
    for seg in segments:
        write_window(view, layer, seg, kv[seg.tokens])
