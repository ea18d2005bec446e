"""The torch backend: each kernel kind in plain PyTorch over the grouped pools.

The same code runs on cpu, cuda, or Ascend through torch_npu. Padded rows and empty
slots are skipped (fixed shapes are the contract; this backend needs no static shapes).
DeepSeek V4.1 weights run its own forward (runtime/backends/torch_v41.py), the only
backend that does so far.
"""
from __future__ import annotations

import torch

from contract.abi import KernelABI
from runtime.backends import Backend, torch_v41
from runtime.backends.torch_rows import gather as _gather
from runtime.backends.torch_rows import pool_view as _view
from runtime.backends.torch_rows import segments as _segments
from runtime.model.forward import logits, main_model, mtp_block, mtp_write_kv
from runtime.model.paging import PoolView, Segment
from runtime.model.params import ModelParams
from runtime.sampling.batch_sampler import unpack_mask


class TorchBackend(Backend):
    """Eager, one process: every capability at its default."""

    name = "torch"

    def __init__(self) -> None:
        self._kinds = {"prefill_main": _prefill_main, "prefill_mtp": _prefill_mtp,
                       "decode": _decode, "decode_mtp": _decode_mtp}

    def launch(self, kernel: KernelABI, args) -> None:
        named = args._asdict()
        kinds = torch_v41.KINDS if named["weights"].args.is_v41 else self._kinds
        with torch.inference_mode():
            kinds[kernel.kind](kernel, named)


def _main_model(kernel: KernelABI, named: dict, lengths: str, starts: str):
    """The main model over the launch's token rows: (params, segments, streams [T, hc, d]),
    or None when every row is empty."""
    params: ModelParams = named["weights"]
    segments = _segments(named[lengths], named[starts])
    if not segments:
        return None
    h = main_model(params, _gather(named["token_ids"], segments), segments,
                   _view(kernel, named), kernel.tile)
    return params, segments, h


def _prefill_main(kernel: KernelABI, named: dict) -> None:
    ran = _main_model(kernel, named, "chunk_lens", "start_pos")
    if ran is None:
        return
    params, segments, h = ran
    last = torch.tensor([s.offset + s.length - 1 for s in segments], device=h.device)
    out = logits(params, h[last])
    window = named["mtp_hidden"].shape[2] if "mtp_hidden" in named else 0
    for i, s in enumerate(segments):
        named["logits"][s.rank, s.row] = out[i]
        if window:
            keep = min(window, s.length)
            end = s.offset + s.length
            named["mtp_hidden"][s.rank, s.row, :keep] = h[end - keep:end]


def _prefill_mtp(kernel: KernelABI, named: dict) -> None:
    params: ModelParams = named["weights"]
    segments = _segments(named["num_rows"], named["start_pos"])
    if not segments:
        return
    layer = params.args.mtp_layers[0]
    mtp_write_kv(params, layer, _gather(named["mtp_hidden"], segments),
                 _gather(named["next_ids"], segments), segments, _view(kernel, named))


def _decode(kernel: KernelABI, named: dict) -> None:
    ran = _main_model(kernel, named, "row_lens", "positions")
    if ran is None:
        return
    params, segments, h = ran
    out = logits(params, h)
    for s in segments:
        named["logits"][s.rank, s.row, : s.length] = out[s.tokens]


def _decode_mtp(kernel: KernelABI, named: dict) -> None:
    """Per row: draft K tokens (K >= 0) with the MTP block from the slot's (hidden,
    tail), then run the main model on [tail, drafts]. Rows whose slot generation moved
    on are skipped."""
    params: ModelParams = named["weights"]
    field = kernel.mtp_field
    rows = _live_rows(named, field)
    if not rows:
        return
    view, k = _view(kernel, named), named["draft_ids"].shape[2]
    tails = torch.stack([named["mtp_slots"][r, slot, field.TAIL_TOKEN] for r, _, slot in rows])
    tail_pos = [int(named["mtp_slots"][r, slot, field.TAIL_POS]) for r, _, slot in rows]
    hidden = torch.stack([named["mtp_slot_hidden"][r, slot] for r, _, slot in rows])
    masks = torch.stack([named["draft_mask"][r, b] for r, b, _ in rows])
    drafts = _draft(params, kernel, view, rows, tails, tail_pos, hidden, k, masks)
    segments = [Segment(r, b, pos, k + 1, i * (k + 1))
                for i, ((r, b, _), pos) in enumerate(zip(rows, tail_pos))]
    ids = torch.cat((tails[:, None], drafts), dim=1).reshape(-1)
    h = main_model(params, ids, segments, view, kernel.tile)
    out = logits(params, h)
    for i, (r, b, _) in enumerate(rows):
        named["logits"][r, b] = out[i * (k + 1):(i + 1) * (k + 1)]
        named["hidden"][r, b] = h[i * (k + 1):(i + 1) * (k + 1)]
        named["draft_ids"][r, b] = drafts[i]


def _live_rows(named: dict, field) -> list[tuple[int, int, int]]:
    """(rank, row, slot) of rows whose slot still belongs to the expected generation."""
    live = []
    for r, b in torch.nonzero(named["slot_ids"] >= 0).tolist():
        slot = int(named["slot_ids"][r, b])
        if int(named["mtp_slots"][r, slot, field.GENERATION]) == int(named["slot_gens"][r, b]):
            live.append((r, b, slot))
    return live


def _draft(params: ModelParams, kernel: KernelABI, view: PoolView,
           rows: list[tuple[int, int, int]], tails: torch.Tensor, tail_pos: list[int],
           hidden: torch.Tensor, k: int, masks: torch.Tensor) -> torch.Tensor:
    """K greedy drafts per row [rows, K] (K = 0: none, only the block's window row at
    tail_pos - 1 is written); step i runs the MTP block at position tail_pos - 1 + i on
    (streams, token), chaining the block's own output streams and draft. The first draft
    takes only tokens its row's mask [rows, ceil(V / 32)] allows."""
    layer = params.args.mtp_layers[0]
    token, drafts = tails, []
    if not k:
        segments = [Segment(r, b, pos - 1, 1, i)
                    for i, ((r, b, _), pos) in enumerate(zip(rows, tail_pos))]
        mtp_write_kv(params, layer, hidden, tails, segments, view)
    for step in range(k):
        segments = [Segment(r, b, pos - 1 + step, 1, i)
                    for i, ((r, b, _), pos) in enumerate(zip(rows, tail_pos))]
        hidden = mtp_block(params, layer, hidden, token, segments, view, kernel.tile)
        scores = logits(params, hidden, params.args.prefix(layer))
        if step == 0:
            allowed = unpack_mask(masks, scores.shape[-1])
            scores = scores.masked_fill(~allowed, float("-inf"))
        token = scores.argmax(-1)
        drafts.append(token)
    return torch.stack(drafts, dim=1) if drafts else tails.new_zeros((len(rows), 0))
