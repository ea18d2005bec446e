"""The DeepSeek V4.1 main model over a flat batch of segments (runtime/model/V41.md).

    h    = embed(ids) in hc_mult copies                          [T, hc, dim]
    pre  = one-hot: stream 0                                     [T, hc]
    per layer L:  h += Engram_L(h)   (L in engram_layers, before the block's mix)
                  (L in dspark_target_layers: keep mean_i h_i, the drafter's input)
                  h, pre = single_pass_block(L, h, pre)
    out  = sum_i pre_i h_i            (the last FFN's pre; no hc_head)   [T, dim]
    logits = head(norm(out))          float32

As in V4, tokens of every segment are concatenated; attention walks each segment against
its own request's pools. Engram hashes every layer's rows once per token: a segment's
n-grams reach back into the N-1 tokens before it, which the caller hands in (`prior`,
raw token ids, the pad id before the sequence starts) since no pool keeps them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from runtime.model import csa2
from runtime.model.block import single_pass_block
from runtime.model.engram import add_engram, ngram_windows
from runtime.model.forward import positions
from runtime.model.hyper import collapse, one_hot_pre
from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams
from runtime.model.quant import linear
from runtime.model.sources import Sources


@dataclass(frozen=True)
class MainOutput:
    hidden: torch.Tensor               # [T, dim]: the collapsed state the head reads
    targets: torch.Tensor | None       # [T, targets * dim]: DSpark's main_hidden


def main_model(params: ModelParams, ids: torch.Tensor, prior: torch.Tensor,
               segments: list[Segment], view: PoolView, tile: int) -> MainOutput:
    """Token ids [T] (prior [S, N-1]: each segment's preceding raw ids, oldest first)
    -> the collapsed hidden state and the DSpark inputs; writes every layer's pools."""
    args = params.args
    pos = positions(segments, ids.device)
    h = params["embed.weight"][ids].unsqueeze(1).expand(-1, args.hc_mult, -1).contiguous()
    pre = one_hot_pre(ids.shape[0], args.hc_mult, ids.device)
    rows = engram_rows(params, ids, prior, segments)
    sources, targets = Sources(), []
    for layer in range(args.n_layers):
        if layer in args.engram_layers:
            index = args.engram_layers.index(layer)
            h = add_engram(h, rows[:, index], params.engram_weights(layer), args.norm_eps)
        if layer in args.dspark_target_layers:
            targets.append(h.float().mean(-2).to(h.dtype))
        here = csa2.Layer(params.layer(layer), args, layer, view,
                          params.rope.table(args.ratio(layer) > 0), sources)
        attention = partial(csa2.attention, here, pos=pos, segments=segments, tile=tile)
        h, pre = single_pass_block(params, layer, h, pre, attention)
    return MainOutput(collapse(h, pre), torch.cat(targets, -1) if targets else None)


def engram_rows(params: ModelParams, ids: torch.Tensor, prior: torch.Tensor,
                segments: list[Segment]) -> torch.Tensor | None:
    """Table row ids [T, engram layers, (N-1) * heads] of every token; None without
    Engram layers."""
    if not params.args.engram_layers:
        return None
    hashing = params.engram
    windows = [ngram_windows(hashing.compress(ids[s.tokens]), hashing.compress(prior[i]))
               for i, s in enumerate(segments)]
    return hashing.rows(torch.cat(windows))


def logits(params: ModelParams, h: torch.Tensor) -> torch.Tensor:
    """Collapsed hidden states [N, dim] -> float32 logits [N, vocab]."""
    x = rms_norm(h, params["norm.weight"], params.args.norm_eps)
    return linear(x, params, "head.weight").float()


def prior_ids(tokens: list[int], start: int, width: int, pad: int) -> list[int]:
    """The `width` raw ids before position `start` of a request whose ids are `tokens`,
    oldest first, `pad` before the sequence."""
    before = tokens[max(0, start - width):start]
    return [pad] * (width - len(before)) + before
