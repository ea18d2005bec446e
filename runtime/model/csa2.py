"""DeepSeek V4.1's attention (CSA2): shared-KV MQA with a per-head sink over the layer's
own window and, in a compressed layer, the compressed entries its index source chose
from its kv source's pages (runtime/model/V41.md section 3).

    q  = wq_b(q_norm(wq_a(x))).view(H, D)      no per-head rescale (V4 had one)
    kv = kv_norm(wkv(x))                       K = V; RoPE on the trailing rope_dim

    role     writes                           scores (indexer)            attends entries of
    window   its window                       -                           -
    full     window, compressed KV, index     own q against own keys      itself
             keys (from the compressor's
             latent)
    reindex  its window                       own q against its kv        its kv source
                                              source's keys
    reuse    its window                       -                           its kv source, with
                                                                          its index source's top-k

A compressed layer's kv source is the latest kv source at or below it, its index source
the latest index source (contract/model_args.py); both ran earlier in this forward, so
their pages hold every entry 0 .. end // ratio - 1 of the segment's request. A full layer
scores against its own keys on every call, whatever the chunking (V41.md's P2): the
result is the whole forward's at every position. Index sources above the candidate
source score inside its kept blocks (runtime/model/indexer.py).

Pool groups (codegen/pool_roles.py): "ori" (every layer's window), and per kv-source
ratio r "cmp_c{r}" (compressed KV), "idx_c{r}" (index keys), "state_c{r}" (r > 1: the
compressor's open group). Queries are walked in tiles of `tile` rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.layer_roles import FULL, REUSE, WINDOW
from contract.model_args import ModelArgs
from runtime.model import compressor, indexer
from runtime.model.attention import (
    Keys,
    attend,
    output_projection,
    project_kv,
    window_mask,
    window_rows,
)
from runtime.model.entry_format import entry_format, index_queries
from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment, arange
from runtime.model.params import LayerParams
from runtime.model.quant import linear
from runtime.model.rope import apply_rope
from runtime.model.sources import Sources


def entries_group(ratio: int) -> str:
    return f"cmp_c{ratio}"


def keys_group(ratio: int) -> str:
    return f"idx_c{ratio}"


def state_group(ratio: int) -> str:
    return f"state_c{ratio}"


@dataclass(frozen=True)
class Layer:
    """One layer's place in the launch: its params, role, sources and tables."""

    p: LayerParams
    args: ModelArgs
    layer: int
    view: PoolView
    inv_freq: torch.Tensor
    sources: Sources

    @property
    def role(self) -> str:
        return self.args.role(self.layer)

    @property
    def ratio(self) -> int:
        return self.args.ratio(self.layer)


def attention(layer: Layer, x: torch.Tensor, pos: torch.Tensor, segments: list[Segment],
              tile: int) -> torch.Tensor:
    """x [T, dim] (the attention's normed input) at positions pos [T] -> [T, dim]."""
    p, args = layer.p, layer.args
    qr = rms_norm(linear(x, p, "attn.wq_a.weight"), p["attn.q_norm.weight"], args.norm_eps)
    q = linear(qr, p, "attn.wq_b.weight").view(x.shape[0], args.n_heads, args.head_dim)
    q = apply_rope(q, pos, layer.inv_freq)
    kv = project_kv(p, args, x, pos, layer.inv_freq)
    index_in = _index_inputs(layer, x, qr, pos) if _runs_indexer(layer) else None
    latent_in = _compressor_rows(layer, x) if layer.role == FULL else None
    out = torch.empty_like(q)
    for i, seg in enumerate(segments):
        s = seg.tokens
        window, window_pos = window_rows(layer.view, layer.layer, seg, kv[s], args.window)
        if latent_in is not None:
            _compress(layer, seg, *(None if rows is None else rows[s] for rows in latent_in))
        entries = _entries(layer, seg)
        chosen = _choose(layer, i, seg, index_in, pos[s], tile) if entries is not None else None
        for t0 in range(0, seg.length, tile):
            t = slice(s.start + t0, min(s.start + t0 + tile, s.stop))
            rows = slice(t0, t0 + t.stop - t.start)
            keys = _keys(entries, chosen, rows, window, window_mask(window_pos, pos[t],
                                                                    args.window))
            out[t] = attend(q[t], keys, p["attn.attn_sink"])
    out = apply_rope(out, pos, layer.inv_freq, inverse=True)
    return output_projection(p, args, out)


def _runs_indexer(layer: Layer) -> bool:
    """Whether the layer runs an indexer (full and reindex layers)."""
    return layer.role not in (WINDOW, REUSE)


def _index_inputs(layer: Layer, x: torch.Tensor, qr: torch.Tensor,
                  pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index queries [T, IH, ID] (RoPE'd, through the index keys' format) and head
    weights [T, IH] (weights_proj(x) * IH^-0.5; the scores apply ID^-0.5)."""
    p, args = layer.p, layer.args
    iq = linear(qr, p, "attn.indexer.wq_b.weight")
    iq = apply_rope(iq.view(x.shape[0], args.index_heads, args.index_head_dim), pos,
                    layer.inv_freq)
    iq = index_queries(entry_format(layer.view.groups[keys_group(layer.ratio)]), iq)
    w = linear(x, p, "attn.indexer.weights_proj.weight").float() * args.index_heads ** -0.5
    return iq, w


def _compressor_rows(layer: Layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A full layer's compressor inputs: kv rows [T, D] and, above ratio 1, gate scores
    [T, D] (float32; no ape)."""
    kv = linear(x, layer.p, "attn.compressor.wkv.weight")
    if layer.ratio == 1:
        return kv, None
    return kv, linear(x, layer.p, "attn.compressor.wgate.weight").float()


def _compress(layer: Layer, seg: Segment, kv: torch.Tensor, score: torch.Tensor | None) -> None:
    """A full layer: the entries completed inside the segment, as index keys
    k_norm(wk(latent)) and compressed KV (the latent), each rotated at the entry's first
    position and written to the layer's pages."""
    p, args, r = layer.p, layer.args, layer.ratio
    state = state_group(r) if r > 1 else None
    j, latent = compressor.latents(layer.view, state, layer.layer, seg, kv, score, r,
                                   p["attn.compressor.norm.weight"], args.norm_eps)
    if not j.numel():
        return
    latent = latent.to(kv.dtype)
    keys = rms_norm(linear(latent, p, "attn.indexer.wk.weight"),
                    p["attn.indexer.k_norm.weight"], args.norm_eps)
    layer.view.write(keys_group(r), seg, layer.layer, j, apply_rope(keys, j * r, layer.inv_freq))
    layer.view.write(entries_group(r), seg, layer.layer, j,
                     apply_rope(latent, j * r, layer.inv_freq))


def _entries(layer: Layer, seg: Segment) -> torch.Tensor | None:
    """The kv source's compressed entries [E, D] the segment may attend (E = end // r);
    None for a window-only layer or before the first entry exists."""
    if layer.role == WINDOW:
        return None
    count = seg.end // layer.ratio
    if not count:
        return None
    source = layer.args.kv_source(layer.layer)
    return layer.view.read(entries_group(layer.ratio), seg, source,
                           arange(0, count, layer.inv_freq.device))


def _choose(layer: Layer, i: int, seg: Segment, index_in, qpos: torch.Tensor,
            tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries each query of segment i attends (indices, valid) [n, k]: a reuse
    layer's index source's, or this layer's indexer's (published for the layers above)."""
    if not _runs_indexer(layer):
        return layer.sources.topk(layer.args.index_source(layer.layer), i)
    args, r = layer.args, layer.ratio
    count = seg.end // r
    keys = layer.view.read(keys_group(r), seg, args.kv_source(layer.layer),
                           arange(0, count, qpos.device))
    iq, w = index_in
    chosen, blocks = [], []
    for t0 in range(0, seg.length, tile):
        rows = slice(seg.offset + t0, min(seg.offset + t0 + tile, seg.tokens.stop))
        tpos = qpos[t0: t0 + rows.stop - rows.start]
        scores = indexer.scores(iq[rows], w[rows], keys, tpos, r)
        if layer.layer == args.candidate_source_layer:
            blocks.append(indexer.candidate_blocks(scores, tpos, r, args.candidate_block_size,
                                                   args.candidate_topk_blocks))
        elif args.candidate_restricted(layer.layer):
            kept = layer.sources.blocks(i)[t0: t0 + rows.stop - rows.start]
            scores = indexer.within_blocks(scores, kept, args.candidate_block_size)
        chosen.append(indexer.top(scores, tpos, r, args.index_topk))
    if blocks:
        layer.sources.publish_blocks(i, torch.cat(blocks))
    indices, valid = (torch.cat(part) for part in zip(*chosen))
    layer.sources.publish_topk(layer.layer, i, indices, valid)
    return indices, valid


def _keys(entries: torch.Tensor | None, chosen: tuple[torch.Tensor, torch.Tensor] | None,
          rows: slice, window: torch.Tensor, window_ok: torch.Tensor) -> Keys:
    """A tile's keys: its window, and the chosen entries [t, k, D] of each query."""
    if entries is None:
        return Keys(window, window_ok, None, None)
    indices, valid = chosen
    return Keys(window, window_ok, entries[indices[rows]], valid[rows])
