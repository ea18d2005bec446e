"""The model as a program of per-layer graphs.

Every layer is one graph call: `block` for a layer kind (sliding, CSA or HCA, hash-routed
or not, or the MTP block) takes the layer's tensors as arguments, so the layers of one
kind share one compiled graph; `head` is the output head. Between them a call's token
rows travel as `h` [N, S, hc, dim]. The dense sub-layers run on every token of a call,
attention on the rows through their block tables, the MoE through grouped matmuls;
invalid tokens are computed too (static shapes) and written nowhere but the scratch page.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from contract.abi import PoolGroup
from contract.model_args import ModelArgs
from runtime.backends.compiled.attention import Weights, attention
from runtime.backends.compiled.expert_parallel import ep_moe
from runtime.backends.compiled.moe import gathered, routed
from runtime.backends.compiled.paged import Paged
from runtime.backends.compiled.rows import Rows
from runtime.model import quant
from runtime.model.attention import project_kv
from runtime.model.hyper import hc_head, hc_post, hc_pre
from runtime.model.moe import route
from runtime.model.norms import rms_norm
from runtime.model.params import ModelParams
from runtime.model.quant import linear

GROUPS_OF = {"sliding": ("ori",), "mtp": ("ori",),
             "hca": ("ori", "hca_state", "cmp_c128"),
             "csa": ("ori", "csa_state", "cmp_c4", "csa_inner_state", "idx")}

# A call of at most this many tokens a row (decode) reads its routed experts per
# (token, expert) pair on a CPU (moe.gathered); longer rows go through grouped matmuls.
GATHER_TOKENS = 8

# Projections that read the same input, fused into one matmul per input: the names of
# the stacked weights of each kind, in stacking order.
FUSED_X = {
    "sliding": ("attn.wq_a.weight", "attn.wkv.weight"),
    "hca": ("attn.wq_a.weight", "attn.wkv.weight", "attn.compressor.wkv.weight",
            "attn.compressor.wgate.weight"),
    "csa": ("attn.wq_a.weight", "attn.wkv.weight", "attn.compressor.wkv.weight",
            "attn.compressor.wgate.weight", "attn.indexer.compressor.wkv.weight",
            "attn.indexer.compressor.wgate.weight", "attn.indexer.weights_proj.weight"),
}
FUSED_QR = {"csa": ("attn.wq_b.weight", "attn.indexer.wq_b.weight")}
FUSED_SHARED = ("ffn.shared_experts.w1.weight", "ffn.shared_experts.w3.weight")


@dataclass(frozen=True)
class Layer:
    """One layer as its graph takes it."""

    id: int
    kind: str                                 # sliding | csa | hca | mtp
    hashed: bool
    weights: Weights                          # its dense tensors, by name without prefix
    experts: tuple[torch.Tensor, ...]         # stacked w13 (w1 then w3), w2 (+ FP4 scales)
    inv_freq: torch.Tensor
    where: dict[str, torch.Tensor]            # group -> its index among the group's layers
    splits: dict[str, tuple[int, ...]]        # fused weight -> the output sizes it stacks

    @property
    def graph(self) -> str:
        """The graph this layer runs: one per kind and routing."""
        return f"{self.kind}{'-hash' if self.hashed else ''}"


def layers(params: ModelParams, groups: dict[str, PoolGroup]) -> list[Layer]:
    """Every layer of the model (main layers, then MTP), as graph arguments."""
    args, out = params.args, []
    for layer in range(args.n_layers + args.n_mtp_layers):
        prefix, kind = args.prefix(layer), args.kind(layer)
        attention_kind = "sliding" if kind == "mtp" else kind
        splits = {"fused.x": _fuse(params, prefix, "fused.x", FUSED_X[attention_kind]),
                  "fused.shared": _fuse(params, prefix, "fused.shared", FUSED_SHARED)}
        if attention_kind in FUSED_QR:
            splits["fused.qr"] = _fuse(params, prefix, "fused.qr", FUSED_QR[attention_kind])
        weights = {name[len(prefix):]: t for name, t in params.dense.items()
                   if name.startswith(prefix)}
        experts = params.experts[layer]
        where = {g: torch.tensor(groups[g].layer_index(layer), device=params.device)
                 for g in GROUPS_OF[kind]}
        out.append(Layer(layer, kind, args.is_hash(layer), weights,
                         experts.tensors(),
                         params.rope.table(kind in ("csa", "hca")), where, splits))
    return out


def _fuse(params: ModelParams, prefix: str, fused: str, names: tuple[str, ...]) -> tuple[int, ...]:
    """Stack the weights `names` of a layer into one [sum of outputs, input] tensor named
    `fused`, and make the originals views of it: one copy in memory, one matmul. FP8
    parts stack with their scales (one per row where a part is not 128-row aligned);
    a mix of FP8 and unquantized parts is dequantized (no release mixes them)."""
    dense = params.dense
    if prefix + fused not in dense:
        parts = [dense[prefix + n] for n in names]
        held = [quant.is_quantized(t) for t in parts]
        if any(held) and not all(held):
            parts = [quant.weight(dense, prefix + n, params.dtype) for n in names]
            for n in names:
                dense.pop(quant.scale_name(prefix + n), None)
        elif all(held):
            dense[quant.scale_name(prefix + fused)] = _stack_scales(dense, prefix, names)
        stacked = torch.cat(parts)
        dense[prefix + fused] = stacked
        at = 0
        for name, part in zip(names, parts):
            dense[prefix + name] = stacked[at: at + part.shape[0]]
            at += part.shape[0]
    return tuple(dense[prefix + n].shape[0] for n in names)


def _stack_scales(dense: dict[str, torch.Tensor], prefix: str,
                  names: tuple[str, ...]) -> torch.Tensor:
    """The FP8 scales of stacked parts: their blocks if every part is 128-row aligned,
    else one scale row per output row."""
    rows = [dense[prefix + n].shape[0] for n in names]
    scales = [dense[quant.scale_name(prefix + n)] for n in names]
    if len({s.dtype for s in scales}) > 1:        # e8m0 beside float scales: all float
        scales = [quant.scale_values(s) for s in scales]
    if all(r % quant.FP8_BLOCK == 0 for r in rows[:-1]):
        return torch.cat(scales)
    return torch.cat([quant.row_scales(s, r) for s, r in zip(scales, rows)])


def block(args: ModelArgs, kind: str, hashed: bool, groups: dict[str, PoolGroup],
          splits: dict[str, tuple[int, ...]], h: torch.Tensor, ids: torch.Tensor,
          start: torch.Tensor, length: torch.Tensor, rank: torch.Tensor,
          tables: dict[str, torch.Tensor], pools: dict[str, torch.Tensor],
          where: dict[str, torch.Tensor], w: Weights, experts: tuple, inv_freq: torch.Tensor,
          entries: torch.Tensor | None) -> torch.Tensor:
    """h [N, S, hc, dim] -> h through one layer of `kind`; writes its pools. For the MTP
    block, h is the block's input (see mtp_input)."""
    n, s, hc, dim = h.shape
    _same_rows(n, ids, start, length, rank, *tables.values())
    if entries is not None and kind == "csa":
        torch._check(entries.shape[0] >= args.index_topk)
    rows = Rows(ids, start, length, rank, tables)
    paged = {g: Paged(pools[g], groups[g], where[g]) for g in GROUPS_OF[kind]}
    mix = (args.norm_eps, args.hc_eps, args.hc_sinkhorn_iters)
    h = h.reshape(n * s, hc, dim)
    y, post, comb = hc_pre(h, w["hc_attn_fn"], w["hc_attn_base"], w["hc_attn_scale"], *mix)
    x = rms_norm(y, w["attn_norm.weight"], args.norm_eps)
    kind_of_attention = "sliding" if kind == "mtp" else kind
    out = attention(w, splits, args, kind_of_attention, x, rows, paged, inv_freq, entries)
    h = hc_post(out, h, post, comb)
    y, post, comb = hc_pre(h, w["hc_ffn_fn"], w["hc_ffn_base"], w["hc_ffn_scale"], *mix)
    x = rms_norm(y, w["ffn_norm.weight"], args.norm_eps)
    chosen, weights = route(w, args, hashed, x, ids.reshape(-1))
    gate, up = linear(x, w, "fused.shared").split(splits["fused.shared"], dim=-1)
    if experts[0].shape[0] < args.n_experts:     # holds a share: rows travel to the ranks
        out = ep_moe(x, chosen, weights, *experts[:2], args.swiglu_limit, list(experts[2:]))
    elif s <= GATHER_TOKENS and x.device.type == "cpu":
        out = gathered(x, chosen, weights, experts, args.swiglu_limit)
    else:
        out = routed(x, chosen, weights, *experts[:2], args.swiglu_limit, *experts[2:])
    out = out + linear(F.silu(gate) * up, w, "ffn.shared_experts.w2.weight")
    return hc_post(out, h, post, comb).view(n, s, hc, dim)


def head(args: ModelArgs, h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
         scale: torch.Tensor, norm: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Streams [..., hc, dim] -> float32 logits [..., vocab]: hc_head, norm, head."""
    shape = h.shape[:-2]
    h = h.reshape(-1, *h.shape[-2:])
    x = rms_norm(hc_head(h, fn, base, scale, args.norm_eps, args.hc_eps), norm, args.norm_eps)
    return F.linear(x, weight).float().view(*shape, -1)


def mtp_input(args: ModelArgs, w: Weights, embed: torch.Tensor, h: torch.Tensor,
              next_ids: torch.Tensor) -> torch.Tensor:
    """e_proj(enorm(embed(next))) broadcast over the streams + h_proj(hnorm(h));
    h [..., hc, dim], next_ids [...]."""
    e = linear(rms_norm(embed[next_ids], w["enorm.weight"], args.norm_eps), w,
               "e_proj.weight")
    hh = linear(rms_norm(h, w["hnorm.weight"], args.norm_eps), w, "h_proj.weight")
    return e.unsqueeze(-2) + hh


def mtp_kv(args: ModelArgs, groups: dict[str, PoolGroup], h: torch.Tensor,
           next_ids: torch.Tensor, start: torch.Tensor, length: torch.Tensor,
           rank: torch.Tensor, table: torch.Tensor, pool: torch.Tensor,
           where: torch.Tensor, w: Weights, embed: torch.Tensor,
           inv_freq: torch.Tensor) -> None:
    """Only the MTP layer's sliding KV for rows of positions start.. (see runtime/model):
    a key row depends on its own token's input alone."""
    n, s = next_ids.shape
    _same_rows(n, h, start, length, rank, table)
    rows = Rows(next_ids, start, length, rank, {"ori": table})
    x = mtp_input(args, w, embed, h, next_ids).view(n * s, *h.shape[-2:])
    y, _, _ = hc_pre(x, w["hc_attn_fn"], w["hc_attn_base"], w["hc_attn_scale"],
                     args.norm_eps, args.hc_eps, args.hc_sinkhorn_iters)
    kv = project_kv(w, args, rms_norm(y, w["attn_norm.weight"], args.norm_eps),
                    rows.pos.reshape(-1), inv_freq)
    ori = Paged(pool, groups["ori"], where)
    ori.write(rows, rows.pos, rows.last(ori.capacity), kv.view(n, s, -1))


def _same_rows(count, *tensors: torch.Tensor) -> None:
    """Tell the compiler that these tensors share their first dimension, the call's row
    count: it varies from call to call, so no shape states it."""
    for tensor in tensors:
        torch._check(tensor.shape[0] == count)
