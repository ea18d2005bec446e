"""A step's launch inputs: token ids, positions and row lengths, MTP slot ids as small
host arrays for the launchers to stage ([ranks, rows], O(rows) per launch); the block
tables gathered on the device from the persistent per-slot tables (BlockTables); the
live rows (flat rank * rows + row) the backend runs; and which flat rows of a launch's
outputs belong to which request. The decode launches of a step are laid out together
(DecodeStep); the prefill's here.

A launch's rows are (rank, row, request): a decode request's row is its index among
its rank's requests in the launch, a prefill chunk's is its slot. Rows without a
request have length 0 and block tables of -1 (the scratch page): they read zeros and
write only scratch pages.

Nothing here reads more of a request than its tail, its last K + 1 tokens or the
tokens of its chunk (and for V4.1's Engram the N - 1 before them: engram_prior): the work
per row does not grow with the context.
"""
from __future__ import annotations

from types import ModuleType

import numpy as np
import torch

from contract.abi import KernelABI
from runtime.core.request import Request
from runtime.core.scheduler import PrefillChunk, SchedulerOutput
from runtime.device.block_tables import BlockTables
from runtime.device.decode_step import DecodeStep
from runtime.device.engram_prior import EngramPrior
from runtime.device.upload import upload

Rows = list[tuple[int, int, Request]]          # (rank, row in the launch, request)


def prefill_extents(contract: ModuleType, launches: list[list[PrefillChunk]]) -> list[int]:
    """The extent of each main prefill launch: its longest piece padded to the tile."""
    return [max(contract.dispatch_extent(p.length) for p in launch) for launch in launches]


def chunk_rows(chunks: list[PrefillChunk]) -> Rows:
    return [(ch.request.rank, ch.slot, ch.request) for ch in chunks]


def live(rows: Rows, width: int, ordered: bool = True) -> np.ndarray:
    """The rows' flat indices rank * width + row into a launch of `width` rows per rank
    (ascending when `ordered`, as a backend takes them; else in the rows' order)."""
    flat = np.fromiter((rank * width + row for rank, row, _ in rows), np.int64, len(rows))
    return np.sort(flat) if ordered else flat


class LaunchInputs:
    """The inputs of `ranks` ranks' launches under spec `spec`; a decode launch's come
    from its kernel (its rows per rank and its K)."""

    def __init__(self, spec: ModuleType, ranks: int, device: torch.device):
        self.spec, self.ranks, self.device = spec, ranks, device
        self.contract = spec.contract
        self.prefill_shape = (ranks, self.contract.SLOTS_PER_RANK)
        self.blocks = BlockTables(spec.pools.GROUPS, ranks, spec.pools.REQUEST_SLOTS_PER_RANK,
                                  device)
        # V4.1 with Engram: the raw ids before each row (the same width in every kernel)
        self.prior = EngramPrior.of(spec.kernels.PREFILL_MAIN, spec.architecture.CONFIG)

    def update(self, out: SchedulerOutput) -> None:
        """The step's requests' block tables brought up to date on the device."""
        self.blocks.update([r for launch in out.decode for r in launch]
                           + [ch.request for ch in out.prefill])

    def tables(self, rows: Rows, width: int, into: dict | None = None) -> dict:
        """The launch's block tables [ranks, width, table_width] per group (-1 past each
        request's blocks, and on rows without one; gathered into `into`, the launcher's
        staging buffers, when given) and its live rows."""
        return dict(live=live(rows, width),
                    **self.blocks.gather(self.blocks.slots(rows, width), into))

    def flat_rows(self, rows: Rows, width: int) -> torch.Tensor:
        """[n] the rows' indices into a launch output viewed as [ranks * width, ...]."""
        return upload(live(rows, width, ordered=False), self.device)

    # -- decode ----------------------------------------------------------------------

    def decode_shape(self, kernel: KernelABI) -> tuple[int, int]:
        """[ranks, batch]: the rows of a launch of decode kernel `kernel`."""
        return (self.ranks, kernel.rows)

    def decode_step(self, launches: list[list[Request]], kernel: KernelABI) -> DecodeStep:
        """The step's decode launches of `kernel` laid out at once (see DecodeStep)."""
        return DecodeStep(launches, kernel.rows, self.ranks, self.blocks, kernel.k,
                          self.contract.TILE, self.device, self.prior)

    # -- prefill ---------------------------------------------------------------------

    def prefill(self, chunks: list[PrefillChunk], extent: int, into: dict | None = None
                ) -> dict:
        """The main prefill: each chunk's tokens in its slot, padded to `extent`."""
        tokens = np.zeros(self.prefill_shape + (extent,), np.int64)
        starts = np.zeros(self.prefill_shape, np.int32)
        lens = np.zeros(self.prefill_shape, np.int32)
        for ch in chunks:
            r = ch.request
            tokens[r.rank, ch.slot, : ch.length] = r.tokens(ch.start, ch.end)
            starts[r.rank, ch.slot], lens[r.rank, ch.slot] = ch.start, ch.length
        return dict(token_ids=tokens, start_pos=starts, chunk_lens=lens, extent=extent,
                    **self._prefill_prior(chunks),
                    **self.tables(chunk_rows(chunks), self.contract.SLOTS_PER_RANK, into))

    def _prefill_prior(self, chunks: list[PrefillChunk]) -> dict:
        """engram_prior [ranks, slots, N - 1]: the ids before each chunk (V4.1 only)."""
        if self.prior is None:
            return {}
        prior = self.prior.empty(self.prefill_shape)
        if chunks:
            rows = self.prior.rows([ch.request for ch in chunks], [ch.start for ch in chunks])
            prior[[ch.request.rank for ch in chunks], [ch.slot for ch in chunks]] = rows
        return dict(engram_prior=prior)

    def prefill_mtp(self, chunks: list[PrefillChunk], into: dict | None = None) -> dict:
        """The MTP layer's window over each chunk's last min(window, length) rows: the
        next token of each row (the last may be unknown yet: 0, patched on the device)."""
        window = self.contract.MTP_WINDOW
        next_ids = np.zeros(self.prefill_shape + (window,), np.int64)
        starts = np.zeros(self.prefill_shape, np.int32)
        nrows = np.zeros(self.prefill_shape, np.int32)
        for ch in chunks:
            r, width = ch.request, min(window, ch.length)
            known = r.tokens(ch.end - width + 1, min(ch.end + 1, r.num_tokens))
            next_ids[r.rank, ch.slot, : len(known)] = known
            starts[r.rank, ch.slot], nrows[r.rank, ch.slot] = ch.end - width, width
        tables = self.tables(chunk_rows(chunks), self.contract.SLOTS_PER_RANK, into)
        return dict(next_ids=next_ids, start_pos=starts, num_rows=nrows, live=tables["live"],
                    block_table_ori=tables["block_table_ori"])

    def first_tokens_patch(self, fill: list[PrefillChunk], first: dict[Request, int],
                           first_tokens: torch.Tensor | None):
        """A patch of the MTP prefill's staged arguments: each fresh prompt's last next
        token is its first sampled token (first_tokens [n, 1], row first[request]),
        written on the device."""
        window = self.contract.MTP_WINDOW

        def patch(args) -> None:
            if fill:
                at = upload([(ch.request.rank, ch.slot, min(window, ch.length) - 1)
                             for ch in fill], self.device)
                pick = upload([first[ch.request] for ch in fill], self.device)
                args.next_ids[at[:, 0], at[:, 1], at[:, 2]] = first_tokens[pick, 0]
        return patch

    # -- warmup ----------------------------------------------------------------------

    def warm_prefill(self, live: int) -> dict:
        """A main prefill of `live` empty-table rows of one tile each."""
        return dict(token_ids=np.zeros(self.prefill_shape + (self.contract.TILE,), np.int64),
                    start_pos=np.zeros(self.prefill_shape, np.int32),
                    chunk_lens=self._warm_lens(live), extent=self.contract.TILE,
                    **self._prefill_prior([]),
                    **self._empty_tables(self.contract.SLOTS_PER_RANK))

    def warm_prefill_mtp(self, live: int) -> dict:
        tables = self._empty_tables(self.contract.SLOTS_PER_RANK)
        return dict(next_ids=np.zeros(self.prefill_shape + (self.contract.MTP_WINDOW,),
                                      np.int64),
                    start_pos=np.zeros(self.prefill_shape, np.int32),
                    num_rows=self._warm_lens(live), block_table_ori=tables["block_table_ori"])

    def _empty_tables(self, width: int) -> dict[str, torch.Tensor]:
        """Every row on the scratch slot: block tables of -1."""
        return self.blocks.gather(self.blocks.slots([], width))

    def _warm_lens(self, live: int) -> np.ndarray:
        lens = np.zeros(self.prefill_shape, np.int32)
        lens[0, :live] = self.contract.TILE
        return lens

    def warm_decode(self, live: int, kernel: KernelABI) -> dict:
        """A decode of `live` rows on empty tables; fused, on the scratch slot
        (generation 0, on scratch pages)."""
        shape = self.decode_shape(kernel)
        common = dict(context=self.contract.TILE, **self._empty_tables(kernel.rows))
        if kernel.kind == "decode_mtp":
            slots = np.full(shape, -1, np.int32)
            slots[0, :live] = self.spec.pools.REQUEST_SLOTS_PER_RANK
            return dict(slot_ids=slots, slot_gens=np.zeros(shape, np.int64), **common)
        lens = np.zeros(shape, np.int32)
        lens[0, :live] = 1
        prior = {} if self.prior is None else dict(engram_prior=self.prior.empty(shape))
        return dict(token_ids=np.zeros(shape + (1,), np.int64),
                    positions=np.zeros(shape, np.int32), row_lens=lens, **prior, **common)
