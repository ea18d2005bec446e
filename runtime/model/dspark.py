"""DeepSeek V4.1's DSpark drafter (runtime/model/V41.md section 6): stages of window-only
single-pass blocks over the main model's hidden states, then a Markov bias and a
confidence head. One block of B drafts per request, after the main step at position p.

    main_x[q]   = main_norm(main_proj(main_hidden[q]))     main_hidden: the target layers'
                                                           input means (forward_v41)  [dim]
    ring        each stage's window pages ("ori") hold main_kv[q] = kv_norm(wkv(main_x[q]))
                RoPE'd at q, for the main positions the model has run (`write_main_kv`)
    block       the anchor (the token at p + 1) and B - 1 noise tokens, at p + 1 .. p + B
    stage       single-pass block whose attention lets every block row see the ring's
                rows p - W + 1 .. p and all B block rows (no causal mask); the block's
                own kv is never stored
    logits[k]   head(norm(h_k)) + markov_w2 @ markov_w1[out_k]; out_0 = anchor,
                out_{k+1} = argmax logits[k] (sequential)
    confidence  proj(concat(h_k, markov_w1[out_k])), raw

Every stage uses rope_theta without YaRN, the main model's embedding and head, and its
own experts (dspark_n_routed_experts, top dspark_n_activated_experts).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from runtime.model.attention import Keys, attend, output_projection, project_kv, write_window
from runtime.model.block import single_pass_block
from runtime.model.entry_format import entry_format
from runtime.model.hyper import collapse, one_hot_pre
from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment, arange
from runtime.model.params import ModelParams
from runtime.model.quant import linear
from runtime.model.rope import apply_rope


@dataclass(frozen=True)
class Drafts:
    ids: torch.Tensor          # [S, B]: drafts for positions p + 2 .. p + B + 1
    logits: torch.Tensor       # [S, B, vocab] float32, the Markov bias added
    confidence: torch.Tensor   # [S, B] float32, raw


def main_inputs(params: ModelParams, targets: torch.Tensor) -> torch.Tensor:
    """main_hidden [T, targets * dim] -> main_x [T, dim], which every stage reads."""
    p, eps = params.layer(params.args.n_layers), params.args.norm_eps
    return rms_norm(linear(targets, p, "main_proj.weight"), p["main_norm.weight"], eps)


def write_main_kv(params: ModelParams, main_x: torch.Tensor, segments: list[Segment],
                  view: PoolView) -> None:
    """Each stage's ring rows of the segments' positions, from main_x [T, dim]."""
    args = params.args
    pos = torch.cat([arange(s.start, s.end, main_x.device) for s in segments])
    for stage in args.mtp_layers:
        kv = project_kv(params.layer(stage), args, main_x, pos, params.rope.main)
        for seg in segments:
            write_window(view, stage, seg, kv[seg.tokens])


def draft(params: ModelParams, anchors: torch.Tensor, rows: list[Segment],
          view: PoolView) -> Drafts:
    """One block per request after its main step at p: anchors [S] (the tokens at p + 1),
    rows[i] a segment of request i at start p + 1, length B, offset i * B."""
    args = params.args
    block = args.dspark_block_size
    ids = torch.full((len(rows), block), args.dspark_noise_id, device=anchors.device)
    ids[:, 0] = anchors
    ids = ids.flatten()
    pos = torch.cat([arange(s.start, s.end, ids.device) for s in rows])
    h = params["embed.weight"][ids].unsqueeze(1).expand(-1, args.hc_mult, -1).contiguous()
    pre = one_hot_pre(ids.shape[0], args.hc_mult, ids.device)
    for stage in args.mtp_layers:
        attention = partial(_attention, params, stage, pos=pos, rows=rows, view=view)
        h, pre = single_pass_block(params, stage, h, pre, attention)
    return _head(params, collapse(h, pre).view(len(rows), block, -1), anchors)


def _attention(params: ModelParams, stage: int, x: torch.Tensor, pos: torch.Tensor,
               rows: list[Segment], view: PoolView) -> torch.Tensor:
    """A stage's attention: x [S * B, dim] of the blocks -> [S * B, dim]."""
    args, p, inv_freq = params.args, params.layer(stage), params.rope.main
    qr = rms_norm(linear(x, p, "attn.wq_a.weight"), p["attn.q_norm.weight"], args.norm_eps)
    q = linear(qr, p, "attn.wq_b.weight").view(x.shape[0], args.n_heads, args.head_dim)
    q = apply_rope(q, pos, inv_freq)
    kv = entry_format(view.groups["ori"]).as_stored(project_kv(p, args, x, pos, inv_freq))
    out = torch.empty_like(q)
    for seg in rows:
        main = arange(max(0, seg.start - args.window), seg.start, x.device)   # ends at p
        keys = torch.cat((view.read("ori", seg, stage, main).to(kv.dtype), kv[seg.tokens]))
        everything = torch.ones(seg.length, keys.shape[0], dtype=torch.bool, device=x.device)
        out[seg.tokens] = attend(q[seg.tokens], Keys(keys, everything, None, None),
                                 p["attn.attn_sink"])
    return output_projection(p, args, apply_rope(out, pos, inv_freq, inverse=True))


def _head(params: ModelParams, h: torch.Tensor, anchors: torch.Tensor) -> Drafts:
    """h [S, B, dim] collapsed -> the drafts, logits with the sequential Markov bias, and
    confidences."""
    last = params.layer(params.args.mtp_layers[-1])
    logits = linear(rms_norm(h, last["norm.weight"], params.args.norm_eps), params,
                    "head.weight").float()
    w1 = last["markov_head.markov_w1.weight"].float()                    # [vocab, rank]
    w2 = last["markov_head.markov_w2.weight"].float()                    # [vocab, rank]
    out, embedded = [anchors], []
    for k in range(h.shape[1]):
        e = w1[out[-1]]                                                  # [S, rank]
        logits[:, k] += F.linear(e, w2)
        embedded.append(e)
        out.append(logits[:, k].argmax(-1))
    features = torch.cat((h.float(), torch.stack(embedded, 1)), -1)      # [S, B, dim + rank]
    confidence = F.linear(features, last["confidence_head.proj.weight"].float()).squeeze(-1)
    return Drafts(torch.stack(out[1:], 1), logits, confidence)
