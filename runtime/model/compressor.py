"""KV compressors of CSA (ratio 4, overlapped) and HCA (ratio 128) layers, and V4.1's
(ratio 1 or 2, never overlapped), on the pools.

Every token contributes a kv row and a gate-score row (score = wgate(x) + ape[pos % ratio]),
each `coff * width` wide: coff = 2 for the overlapped CSA series, 1 for HCA. Entry j:

    HCA:  softmax over the 128 tokens of window j, per channel, of the scores; the
          weighted sum of their kv rows.
    CSA:  the same over 8 slots: window j-1's first `width` channels (series a) and
          window j's last `width` channels (series b); window -1 has weight 0.

then RMSNorm and RoPE at position j * ratio. V4.1 (`latents`): score = wgate(x), no ape,
coff 1 at ratio 2; at ratio 1 an entry is RMSNorm(wkv(x)) of its own token; the caller
derives the index keys from the unrotated latent before it rotates and stores the entry.
Entry j is written once position (j+1)*ratio - 1 is seen. The pending rows live in the
state pool (a ring of `coff * ratio` rows, fp32); a request reads back only rows it wrote
itself.
"""
from __future__ import annotations

import torch

from runtime.model.norms import rms_norm
from runtime.model.paging import PoolView, Segment, arange
from runtime.model.rope import apply_rope


def update(view: PoolView, state: str, entries: str, layer: int, seg: Segment,
           kv: torch.Tensor, score: torch.Tensor, ratio: int, norm: torch.Tensor,
           eps: float, inv_freq: torch.Tensor) -> int:
    """Fold a segment's rows kv, score [n, coff*width] into the compressor of `layer`;
    write every entry completed inside the segment. Returns the entries now existing."""
    coff = kv.shape[-1] // norm.shape[0]
    j, pooled = _fold(view, state, layer, seg, kv, score, ratio, coff)
    if j.numel():
        pooled = apply_rope(rms_norm(pooled, norm, eps), j * ratio, inv_freq)
        view.write(entries, seg, layer, j, pooled)
    return seg.end // ratio


def latents(view: PoolView, state: str | None, layer: int, seg: Segment, kv: torch.Tensor,
            score: torch.Tensor | None, ratio: int, norm: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """V4.1's compressor (no overlap, no ape): the entries completed inside the segment,
    (ids j [n], latents [n, width] normed, not rotated). Entry j pools tokens
    j*ratio .. j*ratio + ratio - 1 by a per-channel softmax of their scores, with its
    open group's rows in the ring `state`; at ratio 1 an entry is one token's kv row
    (no gate, no state)."""
    if ratio == 1:
        return arange(seg.start, seg.end, kv.device), rms_norm(kv, norm, eps)
    j, pooled = _fold(view, state, layer, seg, kv, score, ratio, 1)
    return j, rms_norm(pooled, norm, eps)


def _fold(view: PoolView, state: str, layer: int, seg: Segment, kv: torch.Tensor,
          score: torch.Tensor, ratio: int, coff: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the segment's rows to the state ring; (ids j [n], pooled [n, width]
    float32) of the entries completed inside the segment."""
    device = kv.device
    base = max(0, (seg.start // ratio - (coff - 1)) * ratio)      # oldest row still needed
    prior = view.read(state, seg, layer, arange(base, seg.start, device))
    new = torch.cat((kv, score), dim=-1).to(prior.dtype)
    rows = torch.cat((prior, new))                                 # positions [base, end)
    keep = min(seg.length, view.capacity(state))
    view.write(state, seg, layer, arange(seg.end - keep, seg.end, device), new[-keep:])
    j = arange(seg.start // ratio, seg.end // ratio, device)      # entries completed here
    if not j.numel():
        return j, rows.new_zeros(0, kv.shape[-1] // coff, dtype=torch.float32)
    return j, _pool(rows, j * ratio - base, ratio, coff)


def _pool(rows: torch.Tensor, window_start: torch.Tensor, ratio: int, coff: int) -> torch.Tensor:
    """Softmax-gated sums of windows starting at row offsets window_start [nj]."""
    width = rows.shape[-1] // (2 * coff)
    kv, score = rows[:, : coff * width].float(), rows[:, coff * width:].float()
    offsets = window_start[:, None] + torch.arange(ratio, device=rows.device)   # [nj, ratio]
    cur_kv, cur_score = kv[offsets], score[offsets]                # [nj, ratio, coff*width]
    if coff == 1:
        slots_kv, slots_score = cur_kv, cur_score
    else:
        prev = offsets - ratio
        missing = (prev < 0)[..., None]                           # window -1: weight 0
        prev_kv = kv[prev.clamp(min=0)][..., :width].masked_fill(missing, 0.0)
        prev_score = score[prev.clamp(min=0)][..., :width].masked_fill(missing, float("-inf"))
        slots_kv = torch.cat((prev_kv, cur_kv[..., width:]), dim=1)
        slots_score = torch.cat((prev_score, cur_score[..., width:]), dim=1)
    return (slots_kv * torch.softmax(slots_score, dim=1)).sum(dim=1)
