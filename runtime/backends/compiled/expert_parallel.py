"""Expert parallelism across processes: each rank's token rows go to their experts' ranks
and come back, with all-to-all collectives, inside the MoE of every layer.

A rank worker (runtime/executor/rank_worker.py) holds the experts of its own rank only and sets
the process group here before its first launch. Then, per MoE call on T rows:

    dispatch   the T*k (row, expert) pairs sorted by expert, which is by owning rank
               (expert e lives on rank e // experts_per_rank); the pair counts per
               expert go first (all_to_all_single, experts_per_rank to each rank), then
               the rows with the variable splits they sum to: a receiver knows each
               row's expert from the counts
    experts    the received rows grouped by local expert, one grouped matmul each for
               gate/up and down (moe.experts_ffn)
    combine    the results back along the reverse splits, unsorted, weighted by route

Every rank makes the same collective calls in the same order: a rank with no rows in a
launch still takes part (with rows that write nothing; see backend.py). The call is one
opaque operator to the compiler (its splits are host values): a graph keeps it whole.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.backends.compiled.moe import experts_ffn

_GROUP: list = [None]          # the process group of the expert-parallel ranks, once set


def enable(group) -> None:
    """Route every MoE of this process through `group` (a rank worker, at start)."""
    _GROUP[0] = group


def active() -> bool:
    return _GROUP[0] is not None


_LIB = torch.library.Library("v4serve", "FRAGMENT")     # see paged.py: no custom_op layers
_LIB.define("ep_moe(Tensor x, Tensor chosen, Tensor weights, Tensor w13, Tensor w2, "
            "float limit) -> Tensor")


def _exchange(send: torch.Tensor, send_counts: list[int], recv_counts: list[int],
              group) -> torch.Tensor:
    """all_to_all_single of the rows of `send` [sum(send_counts), ...] -> [sum(recv), ...]."""
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts, group=group)
    return out


def _ep_moe(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
            w2: torch.Tensor, limit: float) -> torch.Tensor:
    """x [T, dim], chosen/weights [T, k] (global expert ids), w13/w2 this rank's experts
    -> the routed experts' weighted sum [T, dim]."""
    group = _GROUP[0]
    ranks, local = dist.get_world_size(group), w13.shape[0]
    t, k = chosen.shape
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)                 # by expert, so by rank
    expert = flat[order]
    per_expert = torch.bincount(expert, minlength=ranks * local)        # pairs I send
    got = torch.empty_like(per_expert)               # [source rank, my local expert]
    dist.all_to_all_single(got, per_expert, group=group)
    sends = per_expert.view(ranks, local).sum(1).tolist()
    recvs = got.view(ranks, local).sum(1).tolist()
    rows = _exchange(x[order // k], sends, recvs, group)    # by source, then by expert
    mine = torch.repeat_interleave(torch.arange(local, device=x.device).repeat(ranks),
                                   got)                      # local expert of each row
    by_expert = torch.argsort(mine, stable=True)
    offs = got.view(ranks, local).sum(0).cumsum(0).to(torch.int32)
    y = experts_ffn(rows[by_expert], (w13, w2), offs, limit)
    y = torch.empty_like(y).index_copy(0, by_expert, y)      # the order rows came in
    back = _exchange(y, recvs, sends, group)                 # [T*k, dim], sorted order
    out = torch.empty_like(back).index_copy(0, order, back)
    return (out.view(t, k, -1).float() * weights[..., None]).sum(1).to(x.dtype)


_LIB.impl("ep_moe", _ep_moe, "CompositeExplicitAutograd")


@torch.library.register_fake("v4serve::ep_moe")
def _(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
      w2: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(x)


ep_moe = torch.ops.v4serve.ep_moe
