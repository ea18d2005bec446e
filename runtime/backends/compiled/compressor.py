"""KV compressors of CSA and HCA layers, loop-free over a call's rows.

The formulas are those of runtime/model/compressor.py. Per row of S tokens starting at
position s0, a buffer holds positions [base, base + M + S), M = coff * ratio and
base = (s0 // ratio - (coff - 1)) * ratio: the pending rows read back from the state
ring (positions before s0), then the row's own rows. A row closes at most
C = ceil(S / ratio) windows, entries j0 + c with j0 = s0 // ratio; entry j0 + c's window
starts at buffer row (coff - 1 + c) * ratio whatever s0 is, so every candidate's
window is a fixed slice of the buffer. Each candidate is pooled and written where its
closing token is valid (elsewhere: the scratch page).
"""
from __future__ import annotations

import math

import torch

from runtime.backends.compiled.paged import Paged
from runtime.backends.compiled.rows import Rows
from runtime.model.norms import rms_norm
from runtime.model.rope import apply_rope


def compress(state: Paged, entries: Paged, rows: Rows, kv: torch.Tensor,
             score: torch.Tensor, ratio: int, norm: torch.Tensor, eps: float,
             inv_freq: torch.Tensor) -> None:
    """Fold kv, score [N*S, coff*width] into a layer's compressor; write every entry a
    row completes."""
    n, s = rows.shape
    width = norm.shape[0]
    coff = kv.shape[-1] // width
    m = coff * ratio
    base = (rows.start // ratio - (coff - 1)) * ratio                    # [N]
    new = torch.cat((kv, score), dim=-1).view(n, s, -1).to(state.pool.dtype)
    buffer = _buffer(state, rows, new, base, m)
    count = math.ceil(s / ratio)
    closing = (ratio - 1 - rows.start % ratio)[:, None] \
        + ratio * torch.arange(count, device=kv.device)                   # [N, C]
    entry = (rows.start[:, None] + closing + 1) // ratio - 1               # [N, C]
    pooled = _pool(buffer, count, ratio, coff, width, missing=entry == 0)  # [N, C, width]
    pooled = rms_norm(pooled, norm, eps)
    pooled = apply_rope(pooled.reshape(-1, width), (entry * ratio).reshape(-1), inv_freq)
    entries.write(rows, entry, closing < rows.length[:, None], pooled.view(n, -1, width))


def _buffer(state: Paged, rows: Rows, new: torch.Tensor, base: torch.Tensor,
            m: int) -> torch.Tensor:
    """[N, M + S, 2*coff*width]: positions base.. from the state ring before s0, from the
    row's own rows after; the own rows then join the ring (the last ring-capacity ones)."""
    n, s = rows.shape
    position = base[:, None] + torch.arange(m + s, device=new.device)     # [N, M + S]
    pending = (position[:, :m] >= 0) & (position[:, :m] < rows.start[:, None])
    prior = state.read_then_write(rows, position[:, :m], pending, rows.pos,
                                  rows.last(state.capacity), new)
    prior = torch.cat((prior, prior.new_zeros(n, s, prior.shape[-1])), dim=1)
    own = (position - rows.start[:, None]).clamp(0, s - 1)
    own = new.gather(1, own[..., None].expand(-1, -1, new.shape[-1]))
    return torch.where((position >= rows.start[:, None])[..., None], own, prior)


def _pool(buffer: torch.Tensor, count: int, ratio: int, coff: int, width: int,
          missing: torch.Tensor) -> torch.Tensor:
    """Softmax-gated sums of the windows of the `count` candidate entries [N, C, width]."""
    cur_kv, cur_score = _windows(buffer, (coff - 1) * ratio, count, ratio, coff * width)
    if coff == 1:
        slots_kv, slots_score = cur_kv, cur_score
    else:   # CSA: window j-1's first `width` channels, then window j's last `width`
        prev_kv, prev_score = _windows(buffer, (coff - 2) * ratio, count, ratio,
                                       coff * width)
        gone = missing[..., None, None]                                   # window -1
        prev_kv = prev_kv[..., :width].masked_fill(gone, 0.0)
        prev_score = prev_score[..., :width].masked_fill(gone, float("-inf"))
        slots_kv = torch.cat((prev_kv, cur_kv[..., width:]), dim=2)
        slots_score = torch.cat((prev_score, cur_score[..., width:]), dim=2)
    return (slots_kv * torch.softmax(slots_score, dim=2)).sum(dim=2)


def _windows(buffer: torch.Tensor, first: int, count: int, ratio: int,
             kv_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv and score rows [N, C, ratio, kv_width] of `count` windows, the first starting at
    buffer row `first` (the rows of buffer beyond its end are never a valid window)."""
    rows = buffer[:, first:]
    short = count * ratio - rows.shape[1]
    if short > 0:
        rows = torch.cat((rows, rows.new_zeros(rows.shape[0], short, rows.shape[2])), dim=1)
    rows = rows[:, : count * ratio].reshape(rows.shape[0], count, ratio, -1).float()
    return rows[..., :kv_width], rows[..., kv_width:]
