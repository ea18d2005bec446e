"""Expert parallelism across processes: each rank's token rows reach their experts' ranks
and come back inside the MoE of every layer, in one of two ways.

A rank worker (runtime/executor/rank_worker.py) holds the experts of its own rank only and
sets the process group here before its first launch.

Prefill (rows of a dynamic extent) exchanges exactly the rows each rank needs, per MoE call
on T rows:

    dispatch   the T*k (row, expert) pairs sorted by expert, which is by owning rank
               (expert e lives on rank e // experts_per_rank); the pair counts per
               expert go first (all_to_all_single, experts_per_rank to each rank), then
               the rows with the variable splits they sum to: a receiver knows each
               row's expert from the counts
    experts    the received rows grouped by local expert, one grouped matmul each for
               gate/up and down (moe.experts_ffn)
    combine    the results back along the reverse splits, unsorted, weighted by route

Its splits are host values: right for prefill, where a launch's rows vary anyway, but
a CUDA graph can neither capture a host read nor replay fresh splits. Decode launches
(fixed rows: every row of the layout, empty ones included, on every rank) run inside
`fixed_rows()`, where the MoE has static shapes and never syncs with the host:

    gather     every rank's T rows, routes and weights (all_gather: [ranks * T, ...])
    experts    the pairs routed to this rank's experts first (a stable sort on the local
               expert, the others keyed past the last), one grouped matmul each for
               gate/up and down; pairs of other ranks' experts count zero
    reduce     each row's weighted sum over this rank's experts, summed over the ranks
               (all_reduce), then this rank's own T rows

It moves ranks x T rows where all-to-all moves T x k, and computes the same sums: a decode
launch is a few rows per rank.

Every rank makes the same collective calls in the same order: a rank with no rows in a
launch still takes part (with rows that write nothing; see backend.py). The call is one
opaque operator to the compiler: a graph keeps it whole.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from runtime.backends.compiled.moe import experts_ffn

_GROUP: list = [None]          # the process group of the expert-parallel ranks, once set
_FIXED: list = [False]         # inside fixed_rows(): the static-shape MoE


def enable(group) -> None:
    """Route every MoE of this process through `group` (a rank worker, at start)."""
    _GROUP[0] = group


def active() -> bool:
    return _GROUP[0] is not None


@contextmanager
def fixed_rows() -> Iterator[None]:
    """Within: every MoE call has static shapes and no host sync (decode launches, whose
    rows are the same count on every rank)."""
    _FIXED[0] = True
    try:
        yield
    finally:
        _FIXED[0] = False


_LIB = torch.library.Library("v4serve", "FRAGMENT")     # see paged.py: no custom_op layers
_LIB.define("ep_moe(Tensor x, Tensor chosen, Tensor weights, Tensor w13, Tensor w2, "
            "float limit, Tensor[] scales) -> Tensor")


def _exchange(send: torch.Tensor, send_counts: list[int], recv_counts: list[int],
              group) -> torch.Tensor:
    """all_to_all_single of the rows of `send` [sum(send_counts), ...] -> [sum(recv), ...]."""
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts, group=group)
    return out


def _ep_moe(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
            w2: torch.Tensor, limit: float, scales: list[torch.Tensor] = ()) -> torch.Tensor:
    """x [T, dim], chosen/weights [T, k] (global expert ids), w13/w2 this rank's experts
    (packed FP4 with their two `scales`, dequantized a third at a time inside) -> the
    routed experts' weighted sum [T, dim]."""
    if _FIXED[0]:
        return gathered_moe(x, chosen, weights, w13, w2, limit, _GROUP[0], scales)
    return exchanged_moe(x, chosen, weights, w13, w2, limit, _GROUP[0], scales)


def exchanged_moe(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
                  w13: torch.Tensor, w2: torch.Tensor, limit: float, group,
                  scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The all-to-all MoE: each pair travels to its expert's rank and back."""
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
    y = experts_ffn(rows[by_expert], (w13, w2, *scales), offs, limit)
    y = torch.empty_like(y).index_copy(0, by_expert, y)      # the order rows came in
    back = _exchange(y, recvs, sends, group)                 # [T*k, dim], sorted order
    out = torch.empty_like(back).index_copy(0, order, back)
    return (out.view(t, k, -1).float() * weights[..., None]).sum(1).to(x.dtype)


def gathered_moe(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
                 w13: torch.Tensor, w2: torch.Tensor, limit: float, group,
                 scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The static-shape MoE: every rank's rows gathered, this rank's experts applied to the
    pairs routed to them, the partial sums reduced over the ranks."""
    ranks, rank, local = dist.get_world_size(group), dist.get_rank(group), w13.shape[0]
    t, k = chosen.shape
    xs, routes, gains = (_gather(v, ranks, group) for v in (x, chosen, weights))
    mine = routes.reshape(-1) - rank * local                 # [ranks * T * k] local ids
    key = torch.where((mine >= 0) & (mine < local), mine, local)     # others: past the last
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(local + 1, dtype=torch.int64, device=x.device)
    offs = counts.scatter_add(0, key, torch.ones_like(key)).cumsum(0)[:local].to(torch.int32)
    y = experts_ffn(xs[order // k], (w13, w2, *scales), offs, limit)
    y = torch.where((key[order] < local)[:, None], y, 0)     # rows past the last: not ours
    back = torch.empty_like(y).index_copy(0, order, y)
    partial = (back.view(ranks * t, k, -1).float() * gains[..., None]).sum(1)
    dist.all_reduce(partial, group=group)
    return partial[rank * t:(rank + 1) * t].to(x.dtype)


def _gather(value: torch.Tensor, ranks: int, group) -> torch.Tensor:
    """[T, ...] from every rank -> [ranks * T, ...], rank order."""
    out = value.new_empty((ranks * value.shape[0], *value.shape[1:]))
    dist.all_gather_single(out, value.contiguous(), group=group)
    return out


_LIB.impl("ep_moe", _ep_moe, "CompositeExplicitAutograd")


@torch.library.register_fake("v4serve::ep_moe")
def _(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
      w2: torch.Tensor, limit: float, scales: list[torch.Tensor] = ()) -> torch.Tensor:
    return torch.empty_like(x)


ep_moe = torch.ops.v4serve.ep_moe
