"""The four kernel kinds over a CompiledModel: which rows a launch carries, in what
calls, and where the results go. No Python loop over requests, segments, ranks or
experts and no host sync: the rows in use (`args.live`, flat rank * rows + row, as the
runner knows them) are gathered on the device, run as one call (a main prefill: one call per tile
of its extent), and scattered back into the launcher's output buffers.

    decode       the launch's live rows, [N, seq]
    decode_mtp   the same; [tail, drafts] built on the device from the MTP slots, and a
                 row whose slot generation moved on is masked (length 0), its outputs
                 left as they were (K=0: [tail], the MTP layer's window kept whole)
    prefill_main tile i of every chunk still going, [P, tile], for each tile i
    prefill_mtp  the slots with a window, [P, mtp_window]
"""
from __future__ import annotations

import numpy as np
import torch

from contract.abi import KernelABI
from runtime.backends.compiled import expert_parallel
from runtime.backends.compiled.model import Call, CompiledModel
from runtime.sampling.batch_sampler import unpack_mask


def _flat(t: torch.Tensor) -> torch.Tensor:
    """[ranks, rows, ...] -> [ranks * rows, ...]."""
    return t.flatten(0, 1)


def _tables(kernel: KernelABI, args, index: torch.Tensor) -> dict[str, torch.Tensor]:
    return {g: _flat(getattr(args, "block_table_" + g))[index].long() for g in kernel.groups}


def _pools(kernel: KernelABI, args) -> dict[str, torch.Tensor]:
    return {g: getattr(args, "pool_" + g) for g in kernel.groups}


def decode(model: CompiledModel, kernel: KernelABI, args, index: torch.Tensor) -> None:
    """Logits of every token of the rows `index` (flat rank * batch + row)."""
    batch = args.token_ids.shape[1]
    call = Call(_flat(args.token_ids)[index], _flat(args.positions)[index].long(),
                _flat(args.row_lens)[index].long(), index // batch, _tables(kernel, args, index))
    h = model.main(call, _pools(kernel, args), kernel.context_bucket(args.context))
    _flat(args.logits).index_copy_(0, index, model.logits(h))


def decode_mtp(model: CompiledModel, kernel: KernelABI, args, index: torch.Tensor) -> None:
    """Per row of `index`: K greedy drafts from its slot's (hidden, tail) (K = 0: none,
    only the MTP layer's window row of the tail's predecessor is written), then the main
    model on [tail, drafts]; logits, streams and drafts of the live rows (a row whose
    slot is -1 or whose generation moved on computes on scratch pages only)."""
    field, batch = kernel.mtp_field, args.slot_ids.shape[1]
    rank, slot = index // batch, _flat(args.slot_ids)[index].long()
    state = args.mtp_slots[rank, slot]                                     # [N, fields]
    live = ((slot >= 0) & (state[:, field.GENERATION] == _flat(args.slot_gens)[index])).long()
    tail, tail_pos = state[:, field.TAIL_TOKEN], state[:, field.TAIL_POS]
    tables, pools = _tables(kernel, args, index), _pools(kernel, args)
    bucket, k = kernel.context_bucket(args.context), args.draft_ids.shape[-1]
    hidden, token, drafts = args.mtp_slot_hidden[rank, slot], tail, []
    for step in range(k):          # K is the layout's: unrolled, not data-driven
        call = Call(token[:, None], tail_pos - 1 + step, live, rank, tables)
        hidden = model.mtp(hidden[:, None], call, pools, bucket)[:, 0]
        logits = model.logits(hidden, mtp=True)
        if step == 0:              # the first draft follows the tail: the tail's mask holds
            allowed = unpack_mask(_flat(args.draft_mask)[index], logits.shape[-1])
            logits = logits.masked_fill(~allowed, float("-inf"))
        token = logits.argmax(-1)
        drafts.append(token)
    if not k:                      # the window row a first draft writes, without the draft
        model.mtp_kv(hidden[:, None], Call(tail[:, None], tail_pos - 1, live, rank,
                                           {"ori": tables["ori"]}), pools["ori"])
        tail_pos = tail_pos.contiguous()   # the plain decode's graphs: packed positions
    drafts = torch.stack(drafts, dim=1) if drafts else tail.new_zeros((len(tail), 0))
    call = Call(torch.cat((tail[:, None], drafts), dim=1), tail_pos, live * (k + 1), rank,
                tables)
    h = model.main(call, pools, bucket)
    keep = live.bool()
    for out, new in ((args.logits, model.logits(h)), (args.hidden, h),
                     (args.draft_ids, drafts)):
        old = _flat(out)[index]
        mask = keep.view(-1, *([1] * (new.dim() - 1)))
        _flat(out).index_copy_(0, index, torch.where(mask, new.to(out.dtype), old))


def prefill_mtp(model: CompiledModel, kernel: KernelABI, args, index: torch.Tensor) -> None:
    """The MTP layer's sliding KV over the windows of the slots `index`."""
    slots = args.next_ids.shape[1]
    call = Call(_flat(args.next_ids)[index], _flat(args.start_pos)[index].long(),
                _flat(args.num_rows)[index].long(), index // slots,
                {"ori": _flat(args.block_table_ori)[index].long()})
    model.mtp_kv(_flat(args.mtp_hidden)[index], call, args.pool_ori)


def prefill_main(model: CompiledModel, kernel: KernelABI, args, index=None) -> None:
    """Walk the extent one tile at a time, every chunk still going in the same call;
    keep each chunk's last row (its logits) and its last mtp_window rows."""
    walk = Walk(kernel, args)
    if not walk.chunks and not expert_parallel.active():
        return
    pools = _pools(kernel, args)
    for step in range(walk.steps):
        call, bucket = walk.call(step)
        walk.collect(step, model.main(call, pools, bucket))
    if not walk.chunks:
        return
    index = walk.finished
    _flat(args.logits).index_copy_(0, index, model.logits(walk.last[index]))


class Walk:
    """The tile walk of one main prefill, from the host copies of its metadata: which
    chunks each step carries and where their outputs go."""

    def __init__(self, kernel: KernelABI, args):
        self.kernel, self.args, self.tile = kernel, args, kernel.tile
        lens = args.host["chunk_lens"]
        self.home = args.live                                   # flat (rank, slot) of chunks
        self.chunks = len(self.home)
        self.lens = lens.reshape(-1)[self.home].astype(np.int64)
        self.starts = args.host["start_pos"].reshape(-1)[self.home].astype(np.int64)
        # every tile of the extent: with expert parallelism across processes, every rank
        # walks as many tiles as the longest chunk of any rank needs (its collectives)
        self.steps = args.extent // self.tile if expert_parallel.active() \
            else -(-int(self.lens.max(initial=0)) // self.tile)
        self.slots = lens.shape[1]
        self.device = args.token_ids.device
        self.mtp = _flat(args.mtp_hidden) if "mtp_hidden" in args._fields else None
        hc, dim = args.weights.args.hc_mult, args.weights.args.dim
        self.last = torch.zeros((lens.size, hc, dim), dtype=args.weights.dtype,
                                device=self.device)
        self.finished = self._index(self.home)
        self._going = np.zeros(0, np.int64)

    def _index(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(self.device)

    def call(self, step: int) -> tuple[Call, int]:
        """The call of tile `step` and its context bucket."""
        at = step * self.tile
        self._going = np.nonzero(self.lens > at)[0]
        going = self._going
        if not len(going):                # none of this rank's: one row that writes nothing
            return self._idle(), self.kernel.context_buckets[0]
        home = self._index(self.home[going])
        start, length = self.starts[going] + at, np.minimum(self.lens[going] - at, self.tile)
        bucket = self.kernel.context_bucket(int((start + length).max()))
        ids = _flat(self.args.token_ids)[home, at:at + self.tile]
        return Call(ids, self._index(start), self._index(length), home // self.slots,
                    _tables(self.kernel, self.args, home)), bucket

    def _idle(self) -> Call:
        """Slot 0 of rank 0 at length 0: it reads, and writes only scratch pages."""
        home = self._index(np.zeros(1))
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        ids = _flat(self.args.token_ids)[home, :self.tile]
        return Call(ids, zero, zero, zero, _tables(self.kernel, self.args, home))

    def collect(self, step: int, h: torch.Tensor) -> None:
        """Keep the last row of the chunks ending in this tile, and the rows of each
        chunk's last mtp_window."""
        if not len(self._going):
            return
        flat = h.reshape(-1, *h.shape[2:])                         # [P * tile, hc, dim]
        at, going = step * self.tile, self._going
        lens, home = self.lens[going], self.home[going]
        length = np.minimum(lens - at, self.tile)
        ends = lens <= at + self.tile
        src = np.nonzero(ends)[0] * self.tile + length[ends] - 1
        self.last.index_copy_(0, self._index(home[ends]), flat[self._index(src)])
        if self.mtp is None:
            return
        window = self.mtp.shape[1]
        keep = np.minimum(window, lens)
        first = np.maximum(at, lens - keep)                  # chunk rows to keep in tile
        count = np.maximum(0, at + length - first)
        src = _ranges(np.arange(len(going)) * self.tile + first - at, count)
        dst = _ranges(home * window + first - (lens - keep), count)
        self.mtp.view(-1, *self.mtp.shape[2:]).index_copy_(0, self._index(dst),
                                                           flat[self._index(src)])


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of arange(s, s + c) for every (s, c)."""
    offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
    return offsets + np.arange(int(counts.sum()))


# The function that runs each kernel kind: (model, kernel, args, live row index).
BY_KIND = {"prefill_main": prefill_main, "prefill_mtp": prefill_mtp, "decode": decode,
           "decode_mtp": decode_mtp}
