"""The lightning indexer of CSA layers: which compressed entries each query attends to.

    score(t, j) = sum_h relu(q_{t,h} . k_j) * index_head_dim^-0.5 * w_{t,h}
    w = weights_proj(x) * index_heads^-0.5

Entries j >= (t+1) // ratio are in the future and never chosen; the top
min(index_topk, entries) by score are kept.
"""
from __future__ import annotations

import torch


def select(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, qpos: torch.Tensor,
           ratio: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [t, heads, dim], w [t, heads], keys [E, dim] -> (indices, valid) [t, k]."""
    scale = q.shape[-1] ** -0.5
    scores = torch.relu(torch.einsum("thd,ed->the", q.float(), keys.float())) * scale
    scores = (scores * w.float().unsqueeze(-1)).sum(dim=1)                     # [t, E]
    visible = (qpos + 1) // ratio                                               # [t]
    entry = torch.arange(keys.shape[0], device=keys.device)
    scores = scores.masked_fill(entry[None, :] >= visible[:, None], float("-inf"))
    indices = scores.topk(min(topk, keys.shape[0]), dim=-1).indices
    return indices, indices < visible[:, None]
