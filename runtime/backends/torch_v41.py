"""The torch backend's DeepSeek V4.1 kernels: the main prefill and the K=0 decode
(runtime/model/forward_v41.py over the grouped pools), by kernel kind.

Both take each row's Engram history (engram_prior [ranks, rows, N - 1], raw ids) with its
tokens, and keep the DSpark stages' window rings (in "ori") following the model, as the
drafter's inputs at every position the main model ran: no drafting launches them yet
(issue 58), but a request's rings are then whole when it does.
"""
from __future__ import annotations

import torch

from contract.abi import KernelABI
from runtime.backends.torch_rows import gather, per_segment, pool_view, segments
from runtime.model import dspark, forward_v41
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams


def _run(kernel: KernelABI, named: dict, lengths: str, starts: str):
    """The main model over the launch's live rows: (params, segments, hidden [T, dim]),
    or None when every row is empty."""
    params: ModelParams = named["weights"]
    segs = segments(named[lengths], named[starts])
    if not segs:
        return None
    view = pool_view(kernel, named)
    main = forward_v41.main_model(params, gather(named["token_ids"], segs),
                                  _priors(params, named, segs), segs, view, kernel.tile)
    _follow_drafter(params, main, segs, view)
    return params, segs, main.hidden


def _priors(params: ModelParams, named: dict, segs: list[Segment]) -> torch.Tensor:
    """[S, N - 1] each segment's raw ids before it; [S, 0] for a model without Engram."""
    if "engram_prior" in named:
        return per_segment(named["engram_prior"], segs)
    return named["token_ids"].new_zeros((len(segs), 0))


def _follow_drafter(params: ModelParams, main: forward_v41.MainOutput, segs: list[Segment],
                    view: PoolView) -> None:
    """Each DSpark stage's ring rows at the launch's positions (none without stages)."""
    if main.targets is not None and params.args.n_mtp_layers:
        dspark.write_main_kv(params, dspark.main_inputs(params, main.targets), segs, view)


def prefill_main(kernel: KernelABI, named: dict) -> None:
    """Logits of each chunk's last row."""
    ran = _run(kernel, named, "chunk_lens", "start_pos")
    if ran is None:
        return
    params, segs, hidden = ran
    last = torch.tensor([s.offset + s.length - 1 for s in segs], device=hidden.device)
    out = forward_v41.logits(params, hidden[last])
    for i, s in enumerate(segs):
        named["logits"][s.rank, s.row] = out[i]


def decode(kernel: KernelABI, named: dict) -> None:
    """Logits of every row token."""
    ran = _run(kernel, named, "row_lens", "positions")
    if ran is None:
        return
    params, segs, hidden = ran
    out = forward_v41.logits(params, hidden)
    for s in segs:
        named["logits"][s.rank, s.row, : s.length] = out[s.tokens]


KINDS = {"prefill_main": prefill_main, "decode": decode}
