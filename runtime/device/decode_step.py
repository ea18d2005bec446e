"""A step's decode launches laid out at once: each row's rank, slot, tail and length read
off its request in one pass over the step, and every launch's inputs cut from those
arrays, with no loop over a launch's rows.

    rows     the step's requests in launch order; launch i holds rows bounds[i]:bounds[i+1]
    row      a request's index among its rank's requests in its launch (a launch is
             [ranks, batch]); rows without a request have length 0 and the scratch slot
    flat     rank * batch + row: a row's index into a launch's outputs viewed as
             [ranks * batch, ...]

What crosses to the device for the step's rows: one upload of every launch's block-table
gather index and output rows (sliced per launch there), then the [ranks, batch] host
arrays each launch stages. Nothing here reads more of a request than its tail and its
length.
"""
from __future__ import annotations

import numpy as np
import torch

from runtime.core.request import Request
from runtime.device.block_tables import BlockTables
from runtime.device.engram_prior import EngramPrior
from runtime.device.upload import upload


class DecodeStep:
    """The decode launches `launches` of one step, [ranks, batch] rows each, K = `k`
    (`tile`: the context of a launch without rows; `prior`: V4.1's Engram history of
    each row, for kernels that take one)."""

    def __init__(self, launches: list[list[Request]], batch: int, ranks: int,
                 blocks: BlockTables, k: int, tile: int, device: torch.device,
                 prior: EngramPrior | None = None):
        self.batch, self.ranks, self.k, self.device = batch, ranks, k, device
        self.prior = prior
        self.blocks, self.launches = blocks, len(launches)
        self.requests = [r for launch in launches for r in launch]
        sizes = np.fromiter(map(len, launches), np.int64, self.launches)
        self.bounds = np.concatenate(([0], np.cumsum(sizes)))
        n = len(self.requests)
        cols = np.fromiter((v for r in self.requests for v in
                            (r.rank, r.slot, r.slot_generation, r.tail, r.num_tokens)),
                           np.int64, 5 * n).reshape(n, 5)
        self.rank, self.slot, self.generation, self.tail, self.length = cols.T
        launch = np.repeat(np.arange(self.launches), sizes)
        self.row = _index_within(launch * ranks + self.rank)
        self.flat = self.rank * batch + self.row
        self._at = launch * (ranks * batch) + self.flat     # in [launches * ranks * batch]
        self._live = self.flat[np.lexsort((self.flat, launch))]  # ascending per launch
        self._contexts = np.full(self.launches, tile, np.int64)
        rows = sizes > 0
        if rows.any():          # a launch's longest row (its tail) + K drafts
            self._contexts[rows] = np.maximum.reduceat(self.length, self.bounds[:-1][rows]) + k
        self._index, self._outputs = self._upload()
        self._tokens: dict[str, np.ndarray] | None = None    # every launch's, made
        self._slots: dict[str, np.ndarray] | None = None     # at the first ask

    def _upload(self) -> tuple[torch.Tensor | None, ...]:
        """Every launch's gather index into the per-slot block tables [launches, ranks *
        batch] (the scratch slot on rows without a request), and every row's flat index,
        in one copy (none for a step without decode launches)."""
        if not self.launches:
            return None, None
        slots = self._grids(self.slot, np.int64, fill=self.blocks.scratch)
        index = self.blocks.flat_index(slots.reshape(-1, self.batch))
        both = upload(np.concatenate((index.reshape(-1), self.flat)), self.device)
        return both[: index.size].view(self.launches, -1), both[index.size:]

    def __len__(self) -> int:
        return self.launches

    def requests_of(self, i: int) -> list[Request]:
        return self.requests[self.bounds[i]: self.bounds[i + 1]]

    def _cut(self, i: int, column: np.ndarray) -> np.ndarray:
        return column[self.bounds[i]: self.bounds[i + 1]]

    def _grids(self, values, dtype, fill: int = 0, width: tuple[int, ...] = ()
               ) -> np.ndarray:
        """[launches, ranks, batch, *width] holding each row's value at its row of its
        launch, `fill` elsewhere."""
        out = np.full((self.launches, self.ranks, self.batch, *width), fill, dtype)
        out.reshape(out.shape[0] * self.ranks * self.batch, -1)[self._at, 0] = values
        return out

    # -- what every decode launch takes ----------------------------------------------

    def common(self, i: int, into: dict | None = None) -> dict:
        """Launch i's context reached (its longest row's tail + K drafts), its block
        tables (gathered into `into`, the launcher's staging buffers, when given) and
        its live rows (flat, ascending)."""
        tables = self.blocks.gather_at(self._index[i], self.ranks, self.batch, into)
        return dict(context=int(self._contexts[i]), live=self._cut(i, self._live), **tables)

    def tokens(self, i: int) -> dict:
        """A plain decode's rows: each request's last token at its position."""
        if self._tokens is None:
            self._tokens = dict(token_ids=self._grids(self.tail, np.int64, width=(1,)),
                                positions=self._grids(self.length - 1, np.int32),
                                row_lens=self._grids(1, np.int32))
            if self.prior is not None:
                self._tokens["engram_prior"] = self._priors(self.prior)
        return {name: value[i] for name, value in self._tokens.items()}

    def _priors(self, prior: EngramPrior) -> np.ndarray:
        """[launches, ranks, batch, N - 1]: the raw ids before each row's tail (V4.1's
        Engram history); pad ids on rows without a request."""
        out = prior.empty((self.launches, self.ranks, self.batch))
        rows = prior.rows(self.requests, (self.length - 1).tolist())
        out.reshape(-1, prior.width)[self._at] = rows
        return out

    def slots(self, i: int) -> dict:
        """A fused MTP decode's rows: each request's slot and its generation (-1: no
        row; a row whose slot moved on to another generation is skipped)."""
        if self._slots is None:
            self._slots = dict(slot_ids=self._grids(self.slot, np.int32, fill=-1),
                               slot_gens=self._grids(self.generation, np.int64))
        return {name: value[i] for name, value in self._slots.items()}

    def rows(self, i: int, kept: list[int]) -> list[int]:
        """The rows (in the launch) of launch i's requests at positions `kept`."""
        row = self._cut(i, self.row)
        return [int(row[j]) for j in kept]

    def outputs(self, i: int, kept: list[int] | None = None) -> torch.Tensor:
        """[n] the flat output rows of launch i's requests (those at positions `kept`
        only, when given), on the device."""
        a, b = self.bounds[i], self.bounds[i + 1]
        if kept is None or len(kept) == b - a:
            return self._outputs[a:b]
        return upload(self._cut(i, self.flat)[kept], self.device)


def _index_within(keys: np.ndarray) -> np.ndarray:
    """Each element's index among the elements before it with the same key."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
    within = np.empty_like(keys)
    within[order] = np.arange(len(keys)) - first
    return within
