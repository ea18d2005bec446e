"""The MTP slots' state on the device; the scheduler's slot table
(runtime/core/mtp_slots.py) hands the slots out, this writes what each one holds:

    slots   [ranks, slots + 1, fields] int64   per slot (MtpField): the tail token, its
                                               position, the tokens committed, the slot's
                                               generation; the last slot is scratch
    hidden  [ranks, slots + 1, hc, d]          the streams of the row before the tail

A slot is zeroed when it changes hands, filled when its request's prefill ends, and
advanced by every decode step that keeps it: a fused one, which verifies its drafts, or
a K=0 step of the kernel that keeps the slots (none drafted, none kept). A plain K=0
step leaves it behind; the next step that keeps it catches it up first (`catch_up`).
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

from runtime.core.request import Request
from runtime.core.scheduler import PrefillChunk
from runtime.device.pools import MtpState
from runtime.device.upload import upload


class MtpSlotState:
    def __init__(self, mtp: MtpState, field: type[IntEnum], window: int, device: torch.device):
        self.mtp, self.field, self.window, self.device = mtp, field, window, device

    def clear(self, request: Request) -> None:
        """The request's new slot starts zeroed."""
        self.mtp.slots[request.rank, request.slot] = 0
        self.mtp.hidden[request.rank, request.slot] = 0

    def fill(self, chunks: list[PrefillChunk], hidden: torch.Tensor,
             first_tokens: torch.Tensor | None, first: dict[Request, int]) -> None:
        """Slots of finished prefills: tail = the first sampled token (a fresh prompt)
        or the known tail (a resumed request), at position end, and the streams of the
        row before it. hidden: the main prefill's mtp_hidden [ranks, slots, window, ...];
        first_tokens [n, 1]: the fresh prompts' first tokens, row first[request]."""
        requests = [ch.request for ch in chunks]
        rank, slot = self._rank_slot(requests)
        tail = upload([r.tail for r in requests], self.device)
        if first:
            fresh = upload([r in first for r in requests], self.device)
            pick = upload([first.get(r, 0) for r in requests], self.device)
            tail = torch.where(fresh, first_tokens[pick, 0], tail)
        end = upload([ch.end for ch in chunks], self.device)
        state = torch.stack((tail, end, end + 1,
                             upload([r.slot_generation for r in requests], self.device)),
                            dim=1)
        f = self.field
        columns = [f.TAIL_TOKEN, f.TAIL_POS, f.COMMITTED, f.GENERATION]
        self.mtp.slots[rank[:, None], slot[:, None],
                         upload(columns, self.device)] = state
        width = upload([min(self.window, ch.length) - 1 for ch in chunks],
                             device=self.device)
        home = upload([ch.slot for ch in chunks], self.device)
        self.mtp.hidden[rank, slot] = hidden[rank, home, width]

    def advance(self, requests: list[Request], tokens: torch.Tensor, accepted: torch.Tensor,
                hidden: torch.Tensor) -> None:
        """The slots' state after verification: with a = accepted[i] drafts kept, the new
        tail is the row's token a (the bonus if every draft was kept, else the target),
        at a + 1 positions on, and the streams before it are the main model's at row a.
        tokens [n, K + 1], accepted [n] int64, hidden [n, K + 1, hc, d]: the step's rows."""
        f = self.field
        rank, slot = self._rank_slot(requests)
        state = self.mtp.slots[rank, slot]
        tail_pos = state[:, f.TAIL_POS] + 1 + accepted
        state[:, f.TAIL_TOKEN] = tokens.gather(1, accepted[:, None])[:, 0]
        state[:, f.TAIL_POS], state[:, f.COMMITTED] = tail_pos, tail_pos + 1
        self.mtp.slots[rank, slot] = state
        self.mtp.hidden[rank, slot] = hidden[torch.arange(len(requests), device=self.device),
                                             accepted]

    def catch_up(self, requests: list[Request]) -> None:
        """Slots that plain K=0 steps left behind: the tail and its position from the
        host, which knows them. The streams stay those of the slot's last step that kept
        it, so the next first draft is made from older streams (verified as any draft:
        the output is the same; it is kept less often)."""
        f = self.field
        rank, slot = self._rank_slot(requests)
        n = len(requests)
        state = np.fromiter((v for r in requests for v in (r.tail, r.num_tokens - 1,
                                                            r.num_tokens)), np.int64, 3 * n)
        columns = upload([f.TAIL_TOKEN, f.TAIL_POS, f.COMMITTED], self.device)
        self.mtp.slots[rank[:, None], slot[:, None], columns] = \
            upload(state.reshape(n, 3), self.device)

    def _rank_slot(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(requests)
        pairs = np.fromiter((v for r in requests for v in (r.rank, r.slot)), np.int64, 2 * n)
        pairs = upload(pairs.reshape(n, 2), self.device)
        return pairs[:, 0], pairs[:, 1]
