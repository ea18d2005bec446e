"""Mixture of experts: routing, expert-parallel routed experts, the shared expert.

    scores = sqrt(softplus(x @ gate.W^T))   (float32)
    hash layers: experts = tid2eid[token id];  others: experts = topk(scores + gate.bias)
    weights = scores[experts], normalised to sum 1, times routed_scaling_factor
    routed expert: w2(silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit))
    shared expert: w2(silu(w1 x) * w3 x)   (no clamp, as in the official code)

V4.1 (`clamped_moe`): no hash layers; a layer's own expert count and top-k (the DSpark
stages have theirs); the top-k weights normalized only when k > 1, with 1e-20 added to
their sum; and the shared expert clamped as the routed ones are.

Routed experts are partitioned over the ranks. Each token row travels to the rank that
owns each of its experts (the all-to-all dispatch), is computed there with that rank's
weights only, and the weighted results are summed back at the token (the combine).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from contract.model_args import ModelArgs
from runtime.model.params import Experts, LayerParams
from runtime.model.quant import weight


def route(p: LayerParams, args: ModelArgs, hashed: bool, x: torch.Tensor,
          ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k], weights [T, k] float32) of every token."""
    scores = torch.sqrt(F.softplus(F.linear(x.float(), p["ffn.gate.weight"].float())))
    if hashed:
        chosen = p["ffn.gate.tid2eid"][ids].long()
    else:
        chosen = (scores + p["ffn.gate.bias"].float()).topk(args.n_active, dim=-1).indices
    weights = scores.gather(1, chosen)
    if args.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return chosen, weights * args.route_scale


def route_topk(p: LayerParams, x: torch.Tensor, k: int,
               route_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """V4.1: (expert ids [T, k], weights [T, k] float32) by topk(scores + bias)."""
    scores = torch.sqrt(F.softplus(F.linear(x.float(), p["ffn.gate.weight"].float())))
    chosen = (scores + p["ffn.gate.bias"].float()).topk(k, dim=-1).indices
    weights = scores.gather(1, chosen)
    if k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return chosen, weights * route_scale


def routed(experts: tuple[Experts, ...], x: torch.Tensor, chosen: torch.Tensor,
           weights: torch.Tensor, limit: float | None) -> torch.Tensor:
    """Dispatch each (token, expert) pair to the expert's owning rank and combine;
    `experts` holds every rank's share, in rank order."""
    per_rank = experts[0].count
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for rank, local in enumerate(experts):
        token, slot = torch.nonzero((chosen // per_rank) == rank, as_tuple=True)
        if token.numel() == 0:
            continue
        expert = chosen[token, slot] - rank * per_rank
        for e in expert.unique().tolist():
            pick = expert == e
            rows = token[pick]
            y = swiglu(x[rows], *local.matrices(e, x.dtype), limit)
            out.index_add_(0, rows, y.float() * weights[rows, slot[pick], None])
    return out.to(x.dtype)


def shared(p: LayerParams, x: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """The shared expert: unclamped in V4, clamped at `limit` in V4.1."""
    w1, w2, w3 = (weight(p, f"ffn.shared_experts.{w}.weight", x.dtype)
                  for w in ("w1", "w2", "w3"))
    return swiglu(x, w1, w2, w3, limit)


def moe(p: LayerParams, args: ModelArgs, hashed: bool, experts: tuple[Experts, ...],
        x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    chosen, weights = route(p, args, hashed, x, ids)
    return routed(experts, x, chosen, weights, args.swiglu_limit) + shared(p, x)


def clamped_moe(p: LayerParams, args: ModelArgs, layer: int, experts: tuple[Experts, ...],
                x: torch.Tensor) -> torch.Tensor:
    """V4.1's MoE of `layer`: routed plus the clamped shared expert, summed in float32."""
    chosen, weights = route_topk(p, x, args.active(layer), args.route_scale)
    limit = args.swiglu_limit if args.swiglu_limit > 0 else None
    out = routed(experts, x, chosen, weights, limit).float()
    return (out + shared(p, x, limit).float()).to(x.dtype)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
           limit: float | None) -> torch.Tensor:
    """w2(silu(w1 x) * w3 x), the gate clamped above and the up projection both ways at
    `limit` (None: unclamped, as V4's shared expert)."""
    gate, up = F.linear(x, w1), F.linear(x, w3)
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.linear(F.silu(gate) * up, w2)

