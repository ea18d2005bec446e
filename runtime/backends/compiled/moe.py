"""Mixture of experts without a loop over experts: dispatch, grouped matmuls, combine.

Routing is runtime/model/moe.py's. The T*k (token, expert) pairs are sorted by expert
(stably): since expert e lives on rank e // experts_per_rank, that order is also the
dispatch of token rows to their owning ranks, and the way back is its inverse
permutation. Between the two, each expert's contiguous run of rows goes through its
weights in one grouped matmul.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.model import quant

_LIB = torch.library.Library("v4serve", "FRAGMENT")     # see paged.py: no custom_op layers
_LIB.define("grouped_mm(Tensor a, Tensor b, Tensor offs) -> Tensor")


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """a [M, K] in expert runs ending at offs [E] (int32), b [E, K, N] -> [M, N]; rows
    past the last run are zeros."""
    if a.device.type == "cpu" or a.dtype == torch.bfloat16:
        return torch._grouped_mm(a, b, offs=offs)
    # where no grouped kernel takes this dtype: each expert's own matrix, never a copy of
    # it per row ([M, K, N] would be tens of GB at V4-Flash sizes)
    if a.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _masked_mm(a, b, offs)
    return _looped_mm(a, b, offs)


def _looped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """One matmul per expert on its run of rows (the run bounds read on the host)."""
    out = a.new_zeros(a.shape[0], b.shape[-1])
    bounds = [0, *offs.tolist()]
    for expert, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if hi > lo:
            out[lo:hi] = a[lo:hi] @ b[expert]
    return out


def _masked_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Every row through every expert, each kept where it is the row's (no host read: what
    a CUDA graph captures; E times the work, for the few rows of a decode launch)."""
    row = torch.arange(a.shape[0], device=a.device)
    expert = torch.searchsorted(offs, row, right=True)
    out = a.new_zeros(a.shape[0], b.shape[-1])
    for e in range(b.shape[0]):
        out = torch.where((expert == e)[:, None], a @ b[e], out)
    return out


_LIB.impl("grouped_mm", _grouped_mm, "CompositeExplicitAutograd")


@torch.library.register_fake("v4serve::grouped_mm")
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[-1])


grouped_mm = torch.ops.v4serve.grouped_mm


def routed(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
           w2: torch.Tensor, limit: float, *scales: torch.Tensor) -> torch.Tensor:
    """Dispatch every (token, expert) pair, run the experts (w13 [E, 2 * inter, dim]: w1's
    rows then w3's; w2 [E, dim, inter]; packed FP4 with their `scales`), combine weighted
    by route."""
    t, k = chosen.shape
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)          # dispatch: by expert, so by rank
    counts = torch.zeros(w13.shape[0], dtype=torch.int64, device=x.device)
    counts = counts.scatter_add(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    y = experts_ffn(x[order // k], (w13, w2, *scales), offs, limit)         # [T*k, dim]
    back = torch.empty_like(y).index_copy(0, order, y)                     # combine
    return (back.view(t, k, -1).float() * weights[..., None]).sum(1).to(x.dtype)


def gathered(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
             held: tuple[torch.Tensor, ...], limit: float) -> torch.Tensor:
    """routed() for the few tokens of a decode call on a CPU: each (token, expert) pair
    reads its expert's matrices in place (a fused reduction over the weights, no grouped
    matmul and no dispatch). It reads T*k experts where grouped matmuls read up to E: the
    choice for decode, whose T*k is small, and where the grouped matmul's per-expert
    loop costs more than the reads (on this path the graph makes no call outside it)."""
    t, k = chosen.shape
    flat = chosen.reshape(-1)                                              # [T*k]
    rows = x.unsqueeze(1).expand(t, k, x.shape[-1]).reshape(t * k, 1, -1)  # [T*k, 1, dim]
    inter = held[0].shape[1] // 2
    gate_up = (rows * _chosen(held, 0, flat, rows.dtype)).sum(-1)        # [T*k, 2 * inter]
    gate, up = gate_up.split(inter, dim=-1)
    act = F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
    down = (act.unsqueeze(1) * _chosen(held, 1, flat, rows.dtype)).sum(-1)       # [T*k, dim]
    return (down.view(t, k, -1).float() * weights[..., None]).sum(1).to(x.dtype)


def _chosen(held: tuple[torch.Tensor, ...], which: int, flat: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:
    """Stack `which` (0: w13, 1: w2) of the experts `flat` [P] -> [P, out, in] in dtype."""
    if len(held) == 2:
        return held[which][flat]
    return quant.dequantize(held[which][flat], held[which + 2][flat], dtype)


def experts_ffn(rows: torch.Tensor, held: tuple[torch.Tensor, ...], offs: torch.Tensor,
                limit: float) -> torch.Tensor:
    """rows [M, dim] in expert runs ending at offs [E] (int32) through their experts'
    clamped SwiGLU -> [M, dim]. `held`: the stacks (w13, w2), gate and up in one matmul;
    or packed FP4 stacks and their scales, dequantized a third at a time (w1, w3, w2:
    each is gone before the next is made)."""
    inter = held[0].shape[1] // 2
    if len(held) == 2:
        gate, up = grouped_mm(rows, held[0].transpose(1, 2), offs).split(inter, dim=-1)
    else:
        gate, up = (grouped_mm(rows, quant.stack(held, 0, rows.dtype, half).transpose(1, 2),
                               offs) for half in (slice(None, inter), slice(inter, None)))
    return grouped_mm(F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit),
                      quant.stack(held, 1, rows.dtype).transpose(1, 2), offs)
