"""One graph call's token rows, as static-shape tensors.

A call is N rows of S tokens: a decode launch is ranks x batch rows of seq tokens; a
prefill tile step is P pieces of `tile` tokens. Row n belongs to rank `rank[n]`, starts
at position `start[n]` and holds `length[n]` valid tokens (0: an empty row, whose every
write lands on the scratch page). Its block tables address that rank's pools. Nothing
below depends on how many rows are valid: validity is a mask, never a branch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rows:
    ids: torch.Tensor                  # [N, S] int64 token ids (anything where invalid)
    start: torch.Tensor                # [N] int64 position of token 0
    length: torch.Tensor               # [N] int64 valid tokens, 0..S
    rank: torch.Tensor                 # [N] int64
    tables: dict[str, torch.Tensor]    # group -> [N, table_width] int64; -1: scratch page

    @property
    def shape(self) -> tuple[int, int]:
        return self.ids.shape[0], self.ids.shape[1]

    @property
    def offsets(self) -> torch.Tensor:
        """[S] token index within a row."""
        return torch.arange(self.ids.shape[1], device=self.ids.device)

    @property
    def pos(self) -> torch.Tensor:
        """[N, S] position of every token."""
        return self.start[:, None] + self.offsets

    @property
    def valid(self) -> torch.Tensor:
        """[N, S] the token is one of the row's `length`."""
        return self.offsets < self.length[:, None]

    def last(self, count: int) -> torch.Tensor:
        """[N, S] the token is among the row's last `count` valid ones."""
        return self.valid & (self.offsets >= self.length[:, None] - count)
