"""Attention of every layer kind: shared-KV MQA with a per-head sink.

    q  = rms_scale(wq_b(q_norm(wq_a(x))).view(H, D));  kv = kv_norm(wkv(x))  (K = V)
    RoPE on the trailing rope_dim channels of q and kv
    keys: the last `window` positions (sliding KV, ring pool "ori"), plus
          HCA: every causal compressed entry;  CSA: the indexer's top-k entries
    softmax(q.k * D^-0.5) with exp(attn_sink_h - max) added to the denominator
    o = inverse RoPE of the output at the query position; grouped wo_a, then wo_b
Queries are walked in tiles of `tile` rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.model_args import ModelArgs
from runtime.model import compressor, indexer
from runtime.model.entry_format import entry_format, index_queries
from runtime.model.norms import rms_norm, rms_scale
from runtime.model.paging import PoolView, Segment, arange
from runtime.model.params import LayerParams
from runtime.model.quant import linear, weight
from runtime.model.rope import apply_rope


@dataclass(frozen=True)
class Keys:
    """Keys (= values) one query tile may attend to, and which of them it may see."""

    window: torch.Tensor        # [m, D]
    window_ok: torch.Tensor     # [t, m]
    entries: torch.Tensor | None  # [E, D] shared by the tile, or [t, k, D] per query
    entries_ok: torch.Tensor | None  # [t, E] or [t, k]


def project_kv(p: LayerParams, args: ModelArgs, x: torch.Tensor, pos: torch.Tensor,
               inv_freq: torch.Tensor) -> torch.Tensor:
    """The shared key/value row of every token: [T, head_dim]."""
    kv = rms_norm(linear(x, p, "attn.wkv.weight"), p["attn.kv_norm.weight"], args.norm_eps)
    return apply_rope(kv, pos, inv_freq)


def write_window(view: PoolView, layer: int, seg: Segment, kv: torch.Tensor) -> None:
    """Store a segment's kv rows [n, D] in the sliding ring (the last ring-capacity ones)."""
    keep = min(seg.length, view.capacity("ori"))
    view.write("ori", seg, layer, arange(seg.end - keep, seg.end, kv.device), kv[-keep:])


def attention(p: LayerParams, args: ModelArgs, layer: int, x: torch.Tensor, pos: torch.Tensor,
              segments: list[Segment], view: PoolView, inv_freq: torch.Tensor,
              tile: int) -> torch.Tensor:
    """x [T, dim] at positions pos [T] -> attention output [T, dim]."""
    qr = rms_norm(linear(x, p, "attn.wq_a.weight"), p["attn.q_norm.weight"], args.norm_eps)
    q = linear(qr, p, "attn.wq_b.weight").view(x.shape[0], args.n_heads, args.head_dim)
    q = apply_rope(rms_scale(q, args.norm_eps), pos, inv_freq)
    kv = project_kv(p, args, x, pos, inv_freq)
    side = _side_inputs(p, args, layer, x, qr, pos, inv_freq)
    out = torch.empty_like(q)
    for seg in segments:
        s = seg.tokens
        window, window_pos = window_rows(view, layer, seg, kv[s], args.window)
        entries = _compress(p, args, layer, seg, view, side, inv_freq)
        for t0 in range(0, seg.length, tile):
            t = slice(s.start + t0, min(s.start + t0 + tile, s.stop))
            keys = _keys(args, layer, seg, view, side, entries, window, window_pos, pos[t], t)
            out[t] = attend(q[t], keys, p["attn.attn_sink"])
    out = apply_rope(out, pos, inv_freq, inverse=True)
    return output_projection(p, args, out)


def _side_inputs(p: LayerParams, args: ModelArgs, layer: int, x: torch.Tensor,
                 qr: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> dict:
    """Per-token inputs of the compressor(s) and indexer of a compressed layer."""
    kind, ratio = args.kind(layer), args.ratio(layer)
    if kind not in ("csa", "hca"):
        return {}
    side = {"main": compressor_rows(p, "attn.compressor.", x, pos, ratio)}
    if kind == "csa":
        side["index"] = compressor_rows(p, "attn.indexer.compressor.", x, pos, ratio)
        iq = linear(qr, p, "attn.indexer.wq_b.weight")
        side["q"] = apply_rope(iq.view(x.shape[0], args.index_heads, args.index_head_dim),
                               pos, inv_freq)
        side["w"] = linear(x, p, "attn.indexer.weights_proj.weight").float() \
            * args.index_heads ** -0.5
    return side


def compressor_rows(p: LayerParams, prefix: str, x: torch.Tensor, pos: torch.Tensor,
                    ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token's compressor input: kv rows and gate scores (+ ape) [T, coff*width]."""
    kv = linear(x, p, prefix + "wkv.weight")
    score = linear(x, p, prefix + "wgate.weight").float() + p[prefix + "ape"][pos % ratio]
    return kv, score


def window_rows(view: PoolView, layer: int, seg: Segment, kv: torch.Tensor,
                window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Earlier rows still inside the window (from the ring), then the segment's own;
    the segment's rows are written to the ring after the earlier ones are read."""
    first = max(0, seg.start - (window - 1))
    positions = arange(first, seg.end, kv.device)
    prior = view.read("ori", seg, layer, positions[: seg.start - first]).to(kv.dtype)
    write_window(view, layer, seg, kv)
    return torch.cat((prior, entry_format(view.groups["ori"]).as_stored(kv))), positions


def _compress(p: LayerParams, args: ModelArgs, layer: int, seg: Segment, view: PoolView,
              side: dict, inv_freq: torch.Tensor) -> torch.Tensor | None:
    """Update the layer's compressor(s) with the segment; all its compressed entries."""
    kind, ratio = args.kind(layer), args.ratio(layer)
    if kind not in ("csa", "hca"):
        return None
    state, entries = ("hca_state", "cmp_c128") if kind == "hca" else ("csa_state", "cmp_c4")
    kv, score = side["main"]
    count = compressor.update(view, state, entries, layer, seg, kv[seg.tokens],
                              score[seg.tokens], ratio, p["attn.compressor.norm.weight"],
                              args.norm_eps, inv_freq)
    if kind == "csa":
        kv, score = side["index"]
        compressor.update(view, "csa_inner_state", "idx", layer, seg, kv[seg.tokens],
                          score[seg.tokens], ratio, p["attn.indexer.compressor.norm.weight"],
                          args.norm_eps, inv_freq)
    return view.read(entries, seg, layer, arange(0, count, kv.device))


def _keys(args: ModelArgs, layer: int, seg: Segment, view: PoolView, side: dict,
          entries: torch.Tensor | None, window: torch.Tensor, window_pos: torch.Tensor,
          qpos: torch.Tensor, t: slice) -> Keys:
    window_ok = window_mask(window_pos, qpos, args.window)
    if entries is None or entries.shape[0] == 0:
        return Keys(window, window_ok, None, None)
    ratio = args.ratio(layer)
    if args.kind(layer) == "hca":
        visible = torch.arange(entries.shape[0], device=qpos.device)[None, :] \
            < ((qpos + 1) // ratio)[:, None]
        return Keys(window, window_ok, entries, visible)
    index_keys = view.read("idx", seg, layer, arange(0, entries.shape[0], qpos.device))
    q = index_queries(entry_format(view.groups["idx"]), side["q"][t])
    chosen, valid = indexer.select(q, side["w"][t], index_keys, qpos, ratio, args.index_topk)
    return Keys(window, window_ok, entries[chosen], valid)


def window_mask(window_pos: torch.Tensor, qpos: torch.Tensor, window: int) -> torch.Tensor:
    """[t, m]: which window rows (positions window_pos [m]) each query (qpos [t]) sees:
    its own position and the window - 1 before it."""
    return (window_pos[None, :] <= qpos[:, None]) & (window_pos[None, :] > qpos[:, None] - window)


def attend(q: torch.Tensor, keys: Keys, sink: torch.Tensor) -> torch.Tensor:
    """q [t, H, D] over the tile's keys, with the per-head sink -> [t, H, D]."""
    scale = q.shape[-1] ** -0.5
    qf = q.float()
    logits = [torch.einsum("thd,md->thm", qf, keys.window.float()) * scale]
    masks = [keys.window_ok]
    if keys.entries is not None:
        pattern = "thd,ed->the" if keys.entries.dim() == 2 else "thd,ted->the"
        logits.append(torch.einsum(pattern, qf, keys.entries.float()) * scale)
        masks.append(keys.entries_ok)
    logits = torch.cat(logits, -1).masked_fill(~torch.cat(masks, -1)[:, None, :], float("-inf"))
    sink = sink.float()[None, :]                                               # [1, H]
    top = torch.maximum(logits.amax(-1), sink)                                # [t, H]
    weights = torch.exp(logits - top.unsqueeze(-1))
    weights = weights / (weights.sum(-1) + torch.exp(sink - top)).unsqueeze(-1)
    m = keys.window.shape[0]
    out = torch.einsum("thm,md->thd", weights[..., :m], keys.window.float())
    if keys.entries is not None:
        pattern = "the,ed->thd" if keys.entries.dim() == 2 else "the,ted->thd"
        out = out + torch.einsum(pattern, weights[..., m:], keys.entries.float())
    return out.to(q.dtype)


def output_projection(p: LayerParams, args: ModelArgs, o: torch.Tensor) -> torch.Tensor:
    """Grouped output projection: per group wo_a to o_lora_rank, concat, then wo_b."""
    groups = args.o_groups
    o = o.reshape(o.shape[0], groups, -1)                                      # [T, g, H*D/g]
    wo_a = weight(p, "attn.wo_a.weight", o.dtype)
    wo_a = wo_a.view(groups, args.o_lora_rank, -1)                             # [g, r, H*D/g]
    mid = torch.einsum("tgi,gri->tgr", o, wo_a).reshape(o.shape[0], -1)
    return linear(mid, p, "attn.wo_b.weight")
