# @generated from specs/deepseek-v4-pro.yaml by codegen — do not edit
"""Fused decode + MTP draft B4S2 (K=1): per row, drafts 1 token(s) from the slot's state,
then runs the main model on [tail, drafts].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from runtime.device.abi import Arg, HostData, KernelABI, check_tensor, check_weights, stage
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, CONTEXT_BUCKETS, RANKS, TILE
from ..pools import GROUPS, MtpField, MtpState, Pools

SPEC_NAME = "deepseek-v4-pro"
NAME = "decode_b4s2"
KIND = "decode_mtp"
ROWS = 4  # decode batch per rank
SEQ = 2
K = 1

# The ABI, in launch order. None is a dimension fixed at run time: the ranks the wrapper
# drives, a pool's block count (+1: the scratch page).
ARGS = (
    Arg("slot_ids", "metadata", torch.int32, (None, 4), "[ranks, batch]"),
    Arg("slot_gens", "metadata", torch.int64, (None, 4), "[ranks, batch]"),
    Arg("draft_mask", "input", torch.int32, (None, 4, 4040), "[ranks, batch, ceil(vocab / 32)]"),
    Arg("block_table_ori", "metadata", torch.int32, (None, 4, 3), "[ranks, batch, 3]"),
    Arg("block_table_cmp_c128", "metadata", torch.int32, (None, 4, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_cmp_c4", "metadata", torch.int32, (None, 4, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_idx", "metadata", torch.int32, (None, 4, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_hca_state", "metadata", torch.int32, (None, 4, 16), "[ranks, batch, 16]"),
    Arg("block_table_csa_state", "metadata", torch.int32, (None, 4, 2), "[ranks, batch, 2]"),
    Arg("block_table_csa_inner_state", "metadata", torch.int32, (None, 4, 2), "[ranks, batch, 2]"),
    Arg(
        "pool_ori",
        "pool",
        torch.bfloat16,
        (None, 62, None, 128, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c128",
        "pool",
        torch.bfloat16,
        (None, 31, None, 1, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c4",
        "pool",
        torch.bfloat16,
        (None, 30, None, 32, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_idx",
        "pool",
        torch.bfloat16,
        (None, 30, None, 32, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_hca_state",
        "pool",
        torch.float32,
        (None, 31, None, 8, 1024),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_state",
        "pool",
        torch.float32,
        (None, 30, None, 4, 2048),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_inner_state",
        "pool",
        torch.float32,
        (None, 30, None, 4, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg("mtp_slots", "pool", torch.int64, (None, 65, 4), "[ranks, slots + 1, 4]"),
    Arg(
        "mtp_slot_hidden",
        "pool",
        torch.bfloat16,
        (None, 65, 4, 7168),
        "[ranks, slots + 1, hc_mult, hidden]",
    ),
    Arg("weights", "weight", None, (), "handle"),
    Arg("context", "scalar", None, (), "int"),
    Arg("logits", "output", torch.float32, (None, 4, 2, 129280), "[ranks, batch, seq, vocab]"),
    Arg(
        "hidden",
        "output",
        torch.bfloat16,
        (None, 4, 2, 4, 7168),
        "[ranks, batch, seq, hc_mult, hidden]",
    ),
    Arg("draft_ids", "output", torch.int64, (None, 4, 1), "[ranks, batch, k]"),
)
KERNEL = KernelABI(
    spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE,
    context_buckets=CONTEXT_BUCKETS, mtp_field=MtpField,
)


class Args(NamedTuple):
    """One launch's arguments by name, as a backend receives them."""

    # [ranks, batch]: MTP state slot of each row; -1 marks an empty row
    slot_ids: torch.Tensor
    # [ranks, batch]: expected slot generation; a row whose slot moved on is left untouched
    slot_gens: torch.Tensor
    # [ranks, batch, ceil(vocab / 32)]: tokens the first draft may take (bit t % 32 of word t //
    # 32): a constrained row's grammar mask at its tail; all bits set for the others
    draft_mask: torch.Tensor
    # [ranks, batch, 3]: rank-local ori block ids per row; -1 (the scratch page) past the last
    # block
    block_table_ori: torch.Tensor
    # [ranks, batch, 8192]: rank-local cmp_c128 block ids per row; -1 (the scratch page) past the
    # last block
    block_table_cmp_c128: torch.Tensor
    # [ranks, batch, 8192]: rank-local cmp_c4 block ids per row; -1 (the scratch page) past the
    # last block
    block_table_cmp_c4: torch.Tensor
    # [ranks, batch, 8192]: rank-local idx block ids per row; -1 (the scratch page) past the last
    # block
    block_table_idx: torch.Tensor
    # [ranks, batch, 16]: rank-local hca_state block ids per row; -1 (the scratch page) past the
    # last block
    block_table_hca_state: torch.Tensor
    # [ranks, batch, 2]: rank-local csa_state block ids per row; -1 (the scratch page) past the
    # last block
    block_table_csa_state: torch.Tensor
    # [ranks, batch, 2]: rank-local csa_inner_state block ids per row; -1 (the scratch page) past
    # the last block
    block_table_csa_inner_state: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: sliding-window KV of every layer, the MTP layer
    # included
    pool_ori: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: HCA compressed KV entries (ratio 128)
    pool_cmp_c128: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: CSA compressed KV entries (ratio 4)
    pool_cmp_c4: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: lightning-indexer compressed keys (ratio 4)
    pool_idx: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: C128 compressor state: pending kv and gate-score
    # rows
    pool_hca_state: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: C4 compressor state: two overlapped windows of kv
    # and gate-score rows
    pool_csa_state: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: indexer compressor state: as csa_state at
    # index_head_dim
    pool_csa_inner_state: torch.Tensor
    # [ranks, slots + 1, 4]: per slot: tail_token, tail_pos, committed, generation; the last slot
    # is scratch
    mtp_slots: torch.Tensor
    # [ranks, slots + 1, hc_mult, hidden]: per slot: pre-hc_head streams of the row before the tail
    # token
    mtp_slot_hidden: torch.Tensor
    # handle: loaded model weights; their fingerprint must match this spec's model
    weights: object
    # int: positions the longest row reaches (its position + seq): the decode graph of the smallest
    # context bucket holding it serves the launch
    context: int
    # [ranks, batch, seq, vocab]: main-model logits of rows [tail, drafts...]
    logits: torch.Tensor
    # [ranks, batch, seq, hc_mult, hidden]: pre-hc_head streams of every row token
    hidden: torch.Tensor
    # [ranks, batch, k]: the MTP drafts this step verified
    draft_ids: torch.Tensor
    # host copies of the staged metadata, for decisions a backend makes before launching
    host: dict[str, np.ndarray]


@dataclass(frozen=True)
class Outputs:
    """Views of the wrapper's output buffers, valid until its next launch."""

    # [ranks, batch, seq, vocab] float32: main-model logits of rows [tail, drafts...]
    logits: torch.Tensor
    # [ranks, batch, seq, hc_mult, hidden] bfloat16: pre-hc_head streams of every row token
    hidden: torch.Tensor
    # [ranks, batch, k] int64: the MTP drafts this step verified
    draft_ids: torch.Tensor


class DecodeB4S2:
    """Launch wrapper of decode_b4s2: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch;
    `ranks` is how many ranks of the replica this wrapper drives (all of them in one
    process, one in a rank worker).
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND,
                 ranks: int = RANKS):
        self.device, self.ranks = torch.device(device), ranks
        self.backend = get_backend(backend)
        self.slot_ids = torch.zeros((self.ranks, 4), dtype=torch.int32, device=self.device)
        self.slot_gens = torch.zeros((self.ranks, 4), dtype=torch.int64, device=self.device)
        self.draft_mask = torch.zeros((self.ranks, 4, 4040), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros(
            (self.ranks, 4, 3), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c128 = torch.zeros(
            (self.ranks, 4, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c4 = torch.zeros(
            (self.ranks, 4, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_idx = torch.zeros(
            (self.ranks, 4, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_hca_state = torch.zeros(
            (self.ranks, 4, 16), dtype=torch.int32, device=self.device,
        )
        self.block_table_csa_state = torch.zeros(
            (self.ranks, 4, 2), dtype=torch.int32, device=self.device,
        )
        self.block_table_csa_inner_state = torch.zeros(
            (self.ranks, 4, 2), dtype=torch.int32, device=self.device,
        )
        self.logits = torch.zeros(
            (self.ranks, 4, 2, 129280), dtype=torch.float32, device=self.device,
        )
        self.hidden = torch.zeros(
            (self.ranks, 4, 2, 4, 7168), dtype=torch.bfloat16, device=self.device,
        )
        self.draft_ids = torch.zeros((self.ranks, 4, 1), dtype=torch.int64, device=self.device)

    def marshal(
        self,
        *,
        slot_ids: HostData,
        slot_gens: HostData,
        draft_mask: HostData,
        block_table_ori: HostData,
        block_table_cmp_c128: HostData,
        block_table_cmp_c4: HostData,
        block_table_idx: HostData,
        block_table_hca_state: HostData,
        block_table_csa_state: HostData,
        block_table_csa_inner_state: HostData,
        pools: Pools,
        mtp: MtpState,
        weights: object,
        context: int,
    ) -> Args:
        """Check and stage every argument; return the launch's Args."""
        return Args(
            slot_ids=stage(self.slot_ids, slot_ids, ARGS[0]),
            slot_gens=stage(self.slot_gens, slot_gens, ARGS[1]),
            draft_mask=stage(self.draft_mask, draft_mask, ARGS[2]),
            block_table_ori=stage(self.block_table_ori, block_table_ori, ARGS[3]),
            block_table_cmp_c128=stage(self.block_table_cmp_c128, block_table_cmp_c128, ARGS[4]),
            block_table_cmp_c4=stage(self.block_table_cmp_c4, block_table_cmp_c4, ARGS[5]),
            block_table_idx=stage(self.block_table_idx, block_table_idx, ARGS[6]),
            block_table_hca_state=stage(self.block_table_hca_state, block_table_hca_state, ARGS[7]),
            block_table_csa_state=stage(self.block_table_csa_state, block_table_csa_state, ARGS[8]),
            block_table_csa_inner_state=stage(self.block_table_csa_inner_state, block_table_csa_inner_state, ARGS[9]),
            pool_ori=check_tensor(pools.ori, ARGS[10], self._shape(ARGS[10]), self.device),
            pool_cmp_c128=check_tensor(pools.cmp_c128, ARGS[11], self._shape(ARGS[11]), self.device),
            pool_cmp_c4=check_tensor(pools.cmp_c4, ARGS[12], self._shape(ARGS[12]), self.device),
            pool_idx=check_tensor(pools.idx, ARGS[13], self._shape(ARGS[13]), self.device),
            pool_hca_state=check_tensor(pools.hca_state, ARGS[14], self._shape(ARGS[14]), self.device),
            pool_csa_state=check_tensor(pools.csa_state, ARGS[15], self._shape(ARGS[15]), self.device),
            pool_csa_inner_state=check_tensor(pools.csa_inner_state, ARGS[16], self._shape(ARGS[16]), self.device),
            mtp_slots=check_tensor(mtp.slots, ARGS[17], self._shape(ARGS[17]), self.device),
            mtp_slot_hidden=check_tensor(mtp.hidden, ARGS[18], self._shape(ARGS[18]), self.device),
            weights=check_weights(weights, FINGERPRINT, SPEC_NAME),
            context=context,
            logits=self.logits,
            hidden=self.hidden,
            draft_ids=self.draft_ids,
            host={
                "slot_ids": np.asarray(slot_ids),
                "slot_gens": np.asarray(slot_gens),
                "block_table_ori": np.asarray(block_table_ori),
                "block_table_cmp_c128": np.asarray(block_table_cmp_c128),
                "block_table_cmp_c4": np.asarray(block_table_cmp_c4),
                "block_table_idx": np.asarray(block_table_idx),
                "block_table_hca_state": np.asarray(block_table_hca_state),
                "block_table_csa_state": np.asarray(block_table_csa_state),
                "block_table_csa_inner_state": np.asarray(block_table_csa_inner_state),
            },
        )

    def _shape(self, arg: Arg) -> tuple[int | None, ...]:
        """An argument's shape with the ranks this wrapper drives in front."""
        return (self.ranks, *arg.shape[1:])

    def launch(self, **kwargs: object) -> Outputs:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**kwargs))

    def run(self, args: Args) -> Outputs:
        """Run the kernel on arguments marshal() built."""
        self.backend.launch(KERNEL, args)
        return Outputs(logits=self.logits, hidden=self.hidden, draft_ids=self.draft_ids)
