"""The lightning indexer of CSA layers: which compressed entries each query attends to.

    score(t, j) = sum_h relu(q_{t,h} . k_j) * index_head_dim^-0.5 * w_{t,h}
    w = weights_proj(x) * index_heads^-0.5

Entries j >= (t+1) // ratio are in the future and never chosen; the top
min(index_topk, entries) by score are kept.

V4.1 adds a first level (`candidate_blocks`): the candidate source layer cuts its score
row into blocks of `block` entries, keeps the best `count` blocks (the query's newest,
partly filled block always), and the index sources above it score only inside them.
"""
from __future__ import annotations

import torch


def select(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, qpos: torch.Tensor,
           ratio: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [t, heads, dim], w [t, heads], keys [E, dim] -> (indices, valid) [t, k]."""
    return top(scores(q, w, keys, qpos, ratio), qpos, ratio, topk)


def scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, qpos: torch.Tensor,
           ratio: int) -> torch.Tensor:
    """[t, E] float32 scores, -inf at the entries a query cannot see yet."""
    scale = q.shape[-1] ** -0.5
    out = torch.relu(torch.einsum("thd,ed->the", q.float(), keys.float())) * scale
    out = (out * w.float().unsqueeze(-1)).sum(dim=1)                            # [t, E]
    entry = torch.arange(keys.shape[0], device=keys.device)
    return out.masked_fill(entry[None, :] >= visible(qpos, ratio)[:, None], float("-inf"))


def visible(qpos: torch.Tensor, ratio: int) -> torch.Tensor:
    """Entries each query may see [t]: those complete at its position."""
    return (qpos + 1) // ratio


def top(scores: torch.Tensor, qpos: torch.Tensor, ratio: int,
        topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top min(topk, E) entries of each row (indices [t, k]) and which of them are
    visible (valid [t, k])."""
    indices = scores.topk(min(topk, scores.shape[-1]), dim=-1).indices
    return indices, indices < visible(qpos, ratio)[:, None]


def candidate_blocks(scores: torch.Tensor, qpos: torch.Tensor, ratio: int, block: int,
                     count: int) -> torch.Tensor:
    """V4.1's candidate source: scores [t, E] -> kept blocks [t, ceil(E / block)] (bool).

    A block scores the max of its entries; the block of the query's newest visible entry
    is pinned; the best min(count, blocks) are kept, less any that scored -inf."""
    t, n = scores.shape
    pad = -n % block
    padded = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    best = padded.view(t, -1, block).amax(-1)                                  # [t, nb]
    newest = (visible(qpos, ratio) - 1).div(block, rounding_mode="floor")      # -1: none
    nb = torch.arange(best.shape[1], device=scores.device)
    best = best.masked_fill(nb[None, :] == newest[:, None], float("inf"))
    kept = best.topk(min(count, best.shape[1]), dim=-1)
    return torch.zeros_like(best, dtype=torch.bool).scatter_(
        -1, kept.indices, kept.values > float("-inf"))


def within_blocks(scores: torch.Tensor, blocks: torch.Tensor, block: int) -> torch.Tensor:
    """scores [t, E] with -inf outside the kept blocks [t, nb] (an index source above the
    candidate source)."""
    inside = blocks.repeat_interleave(block, dim=-1)[:, : scores.shape[-1]]
    return scores.masked_fill(~inside, float("-inf"))
