"""Attention of every layer kind, loop-free over a call's rows (N rows of S tokens).

The formulas are those of runtime/model/attention.py; here every row of a call is
handled at once with fixed shapes:

    window   the window - 1 positions before each row's start, read from the ring
             (zeros before position 0), then the row's own S keys: [N, window - 1 + S]
    HCA      every entry the context bucket holds, [N, E], visible to a query at
             position p where j < (p + 1) // 128
    CSA      the indexer scores every entry the bucket holds, [N, S, E], and a fixed
             top-k (index_topk) picks each query's entries; picks beyond the visible
             ones are masked, as in the reference
A query attends to the keys its mask allows; the sink joins the softmax denominator.
`entries` is arange(E), E = bucket / ratio: the entry count travels as a tensor's
length so that one graph serves every bucket.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from contract.abi import ATTENTION_BAND, INDEXER_TILES
from contract.model_args import ModelArgs
from runtime.backends.compiled.compressor import compress
from runtime.backends.compiled.paged import Paged
from runtime.backends.compiled.rows import Rows
from runtime.model.attention import output_projection
from runtime.model.entry_format import EntryFormat, index_queries
from runtime.model.norms import rms_norm, rms_scale
from runtime.model.quant import linear
from runtime.model.rope import apply_rope

Weights = dict[str, torch.Tensor]     # one layer's dense tensors, by name without prefix
RATIO = {"csa": 4, "hca": 128}
STATE_GROUP = {"csa": "csa_state", "hca": "hca_state"}
ENTRY_GROUP = {"csa": "cmp_c4", "hca": "cmp_c128"}
MANY_QUERIES = 8      # rows longer than this score the indexer a head at a time
BAND = ATTENTION_BAND  # queries of a prefill tile that attend their window keys together
ENTRY_TILES = INDEXER_TILES   # rows up to that score it every head at once, over E / 8
                              # entries at a time: [N, S, heads, E / 8] scores at most


def attention(p: Weights, splits: dict[str, tuple[int, ...]], args: ModelArgs, kind: str,
              x: torch.Tensor, rows: Rows, pools: dict[str, Paged], inv_freq: torch.Tensor,
              entries: torch.Tensor | None) -> torch.Tensor:
    """x [N*S, dim] -> attention output [N*S, dim]; writes the layer's pools. Every
    projection of x is one matmul (fused.x), and so is every projection of qr."""
    heads = _heads(p, splits, args, kind, x, rows, pools, inv_freq, entries)
    return output_projection(p, args, heads)     # the heads' temporaries are gone by now


def _heads(p: Weights, splits: dict[str, tuple[int, ...]], args: ModelArgs, kind: str,
           x: torch.Tensor, rows: Rows, pools: dict[str, Paged], inv_freq: torch.Tensor,
           entries: torch.Tensor | None) -> torch.Tensor:
    """The heads' outputs [N*S, H, D] (before the output projection)."""
    n, s = rows.shape
    pos = rows.pos.reshape(-1)
    xp = linear(x, p, "fused.x").split(splits["fused.x"], dim=-1)
    qr = rms_norm(xp[0], p["attn.q_norm.weight"], args.norm_eps)
    qrp = linear(qr, p, "fused.qr").split(splits["fused.qr"], dim=-1) if "fused.qr" in p \
        else (linear(qr, p, "attn.wq_b.weight"),)
    q = qrp[0].reshape(n * s, args.n_heads, args.head_dim)
    q = apply_rope(rms_scale(q, args.norm_eps), pos, inv_freq)
    kv = rms_norm(xp[1], p["attn.kv_norm.weight"], args.norm_eps)
    kv = apply_rope(kv, pos, inv_freq).view(n, s, -1)
    keys, keys_ok = _window(pools["ori"], rows, kv, args.window)
    picked, picked_ok = None, None
    if kind in RATIO:
        picked, picked_ok = _entries(p, args, kind, xp[2:], qrp[1:], rows, pools, inv_freq,
                                     entries)
    out = _banded(q.view(n, s, args.n_heads, -1), keys, keys_ok, picked, picked_ok,
                  p["attn.attn_sink"], args.window)
    return apply_rope(out.view(n * s, args.n_heads, -1), pos, inv_freq, inverse=True)


def _banded(q: torch.Tensor, keys: torch.Tensor, keys_ok: torch.Tensor,
            entries: torch.Tensor | None, entries_ok: torch.Tensor | None,
            sink: torch.Tensor, window: int) -> torch.Tensor:
    """_attend over query blocks of BAND rows: block j's queries see only the window
    keys [j * BAND, j * BAND + window - 1 + BAND) of the window - 1 + S, so a prefill
    tile's query scores window - 1 + BAND keys, not window - 1 + S (the keys are slices,
    never copies); a decode row (S <= BAND) is one block."""
    s = q.shape[1]
    if s <= BAND:
        return _attend(q, keys, keys_ok, entries, entries_ok, sink)
    span = window - 1 + BAND
    blocks = []
    for at in range(0, s, BAND):                       # S // BAND blocks: unrolled
        rows = slice(at, at + BAND)
        picked = None if entries is None else entries if entries.dim() == 3 \
            else entries[:, rows]
        blocks.append(_attend(q[:, rows], keys[:, at:at + span], keys_ok[:, rows, at:at + span],
                              picked, None if entries_ok is None else entries_ok[:, rows],
                              sink))
    return torch.cat(blocks, dim=1)


def _window(ori: Paged, rows: Rows, kv: torch.Tensor,
            window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys [N, window - 1 + S, D] and which of them each query sees [N, S, window - 1 + S];
    the rows' own keys go to the ring (the last ring-capacity ones)."""
    before = rows.start[:, None] - (window - 1) + torch.arange(window - 1, device=kv.device)
    prior = ori.read_then_write(rows, before, before >= 0, rows.pos,
                                rows.last(ori.capacity), kv).to(kv.dtype)
    keys = torch.cat((prior, ori.format.as_stored(kv)), dim=1)
    key_pos = torch.cat((before, rows.pos), dim=1)                          # [N, window-1+S]
    query = rows.pos[:, :, None]
    seen = (key_pos[:, None, :] <= query) & (key_pos[:, None, :] > query - window) \
        & (key_pos[:, None, :] >= 0)
    return keys, seen


def _entries(p: Weights, args: ModelArgs, kind: str, xp: tuple[torch.Tensor, ...],
             qrp: tuple[torch.Tensor, ...], rows: Rows, pools: dict[str, Paged],
             inv_freq: torch.Tensor,
             entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Update the compressor(s) with the rows' tokens, then the compressed keys each query
    may use: HCA [N, E, D] with [N, S, E]; CSA [N, S, k, D] with [N, S, k]. xp: the
    compressor (and indexer) projections of x; qrp: the indexer's projection of qr."""
    ratio = RATIO[kind]
    pos = rows.pos.reshape(-1)
    kv, score = _compressor_rows(p, "attn.compressor.", xp[0], xp[1], pos, ratio)
    compress(pools[STATE_GROUP[kind]], pools[ENTRY_GROUP[kind]], rows, kv, score, ratio,
             p["attn.compressor.norm.weight"], args.norm_eps, inv_freq)
    visible = (rows.pos + 1) // ratio                                          # [N, S]
    newest = visible.amax(dim=1, keepdim=True)                                # [N, 1]

    def read(group: str, part: torch.Tensor) -> torch.Tensor:   # entries -> [N, len, D]
        there = part[None, :] < newest
        return pools[group].read(rows, part.expand_as(there), there)

    if kind == "hca":
        return read("cmp_c128", entries), entries < visible[..., None]
    kv, score = _compressor_rows(p, "attn.indexer.compressor.", xp[2], xp[3], pos, ratio)
    compress(pools["csa_inner_state"], pools["idx"], rows, kv, score, ratio,
             p["attn.indexer.compressor.norm.weight"], args.norm_eps, inv_freq)

    def index_keys(part: torch.Tensor) -> torch.Tensor:
        return read("idx", part).float()

    chosen, ok = _select(args, xp[4], qrp[0], rows, index_keys, inv_freq, entries, visible,
                         pools["idx"].format)
    n, s = rows.shape
    picked = pools["cmp_c4"].read(rows, chosen.view(n, -1), ok.view(n, -1))
    return picked.view(n, s, chosen.shape[-1], -1), ok


def _compressor_rows(p: Weights, prefix: str, kv: torch.Tensor, gate: torch.Tensor,
                     pos: torch.Tensor, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A compressor's input rows from its projections: kv, and gate scores + ape."""
    return kv, gate.float() + p[prefix + "ape"][pos % ratio]


def _select(args: ModelArgs, weights: torch.Tensor, iq: torch.Tensor, rows: Rows,
            keys: Callable[[torch.Tensor], torch.Tensor], inv_freq: torch.Tensor,
            entries: torch.Tensor, visible: torch.Tensor, key_format: EntryFormat
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The lightning indexer over the keys of `entries` (keys(part): those of a part, [N,
    len, dim] float32, stored in `key_format`), from its query projection iq and head
    weights projection: each query's top index_topk entries [N, S, k] and which of them
    are visible. score(t, j) = sum_h relu(q_th . k_j) * dim^-0.5 * w_th."""
    n, s = rows.shape
    heads, dim = args.index_heads, args.index_head_dim
    iq = iq.reshape(n * s, heads, dim)
    iq = apply_rope(iq, rows.pos.reshape(-1), inv_freq).view(n, s, heads, dim)
    iq = index_queries(key_format, iq).float()
    w = weights.float() * heads ** -0.5
    w = w.view(n, s, heads) * dim ** -0.5
    if s <= MANY_QUERIES:       # decode rows: every head at once, a tile of entries at a time
        torch._check(entries.shape[0] % ENTRY_TILES == 0)
        scores = torch.cat([torch.einsum("nshe,nsh->nse", torch.einsum(
            "nshd,ned->nshe", iq, keys(part)).relu_(), w)
            for part in entries.view(ENTRY_TILES, -1).unbind(0)], dim=-1)
    else:                       # prefill tiles: a head at a time, never [N, S, heads, E]
        every = keys(entries).transpose(1, 2)                            # [N, dim, E]
        scores = torch.zeros(n, s, entries.shape[0], device=every.device)
        for q, gain in zip(iq.unbind(2), w.unsqueeze(-1).unbind(2)):     # [N, S, dim], [N, S, 1]
            scores.addcmul_(torch.bmm(q, every).relu_(), gain)
    scores = scores.masked_fill_(entries >= visible[..., None], float("-inf"))
    chosen = scores.topk(args.index_topk, dim=-1).indices
    return chosen, chosen < visible[..., None]


def _attend(q: torch.Tensor, keys: torch.Tensor, keys_ok: torch.Tensor,
            entries: torch.Tensor | None, entries_ok: torch.Tensor | None,
            sink: torch.Tensor) -> torch.Tensor:
    """q [N, S, H, D] over the window keys and the compressed ones -> [N, S, H, D]."""
    scale = q.shape[-1] ** -0.5
    qf = q.float()
    logits = [torch.einsum("nshd,nkd->nshk", qf, keys.float()).mul_(scale)]
    masks = [keys_ok]
    if entries is not None:
        pattern = "nshd,ned->nshe" if entries.dim() == 3 else "nshd,nsed->nshe"
        logits.append(torch.einsum(pattern, qf, entries.float()).mul_(scale))
        masks.append(entries_ok)
    # in place where a tensor is fresh: the logits over every HCA entry of a 1M context
    # are the largest temporaries of a prefill step, and each copy of them counts
    logits = torch.cat(logits, -1).masked_fill_(~torch.cat(masks, -1)[:, :, None, :],
                                                float("-inf"))
    sink = sink.float()                                                          # [H]
    top = torch.maximum(logits.amax(-1), sink)                                   # [N, S, H]
    weights = logits.sub_(top[..., None]).exp_()
    weights = weights.div_((weights.sum(-1) + torch.exp(sink - top))[..., None])
    m = keys.shape[1]
    out = torch.einsum("nshk,nkd->nshd", weights[..., :m], keys.float())
    if entries is not None:
        pattern = "nshe,ned->nshd" if entries.dim() == 3 else "nshe,nsed->nshd"
        out = out + torch.einsum(pattern, weights[..., m:], entries.float())
    return out.to(q.dtype)
