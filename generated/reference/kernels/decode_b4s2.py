# @generated from specs/reference.yaml by codegen — do not edit
"""Fused decode + MTP draft B4S2 (K=1): per row, drafts 1 token(s) from the slot's state,
then runs the main model on [tail, drafts].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.abi import Arg, HostData, KernelABI, check_per_rank, check_weights, stage
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, RANKS, TILE
from ..pools import GROUPS, MtpState, Pools

SPEC_NAME = "reference"
NAME = "decode_b4s2"
KIND = "decode_mtp"
ROWS = 4  # decode batch per rank
SEQ = 2
K = 1

# Positional ABI, in launch order. Shapes are per rank for per_rank args; None is a
# dimension fixed at run time (a pool's block count).
ARGS = (
    Arg("slot_ids", "metadata", torch.int32, (8, 4), "[ranks, batch]"),
    Arg("slot_gens", "metadata", torch.int64, (8, 4), "[ranks, batch]"),
    Arg("block_table_ori", "metadata", torch.int32, (8, 4, 3), "[ranks, batch, 3]"),
    Arg("block_table_cmp_c128", "metadata", torch.int32, (8, 4, 128), "[ranks, batch, 128]"),
    Arg("block_table_cmp_c4", "metadata", torch.int32, (8, 4, 128), "[ranks, batch, 128]"),
    Arg("block_table_idx", "metadata", torch.int32, (8, 4, 128), "[ranks, batch, 128]"),
    Arg("block_table_hca_state", "metadata", torch.int32, (8, 4, 16), "[ranks, batch, 16]"),
    Arg("block_table_csa_state", "metadata", torch.int32, (8, 4, 2), "[ranks, batch, 2]"),
    Arg("block_table_csa_inner_state", "metadata", torch.int32, (8, 4, 2), "[ranks, batch, 2]"),
    Arg(
        "pool_ori",
        "pool",
        torch.float32,
        (5, None, 128, 128),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_cmp_c128",
        "pool",
        torch.float32,
        (1, None, 1, 128),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_cmp_c4",
        "pool",
        torch.float32,
        (2, None, 32, 128),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_idx",
        "pool",
        torch.float32,
        (2, None, 32, 64),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_hca_state",
        "pool",
        torch.float32,
        (1, None, 8, 256),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_csa_state",
        "pool",
        torch.float32,
        (2, None, 4, 512),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg(
        "pool_csa_inner_state",
        "pool",
        torch.float32,
        (2, None, 4, 256),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg("mtp_slots", "pool", torch.int64, (8, 4), "per rank: [mtp_slots, 4]", per_rank=True),
    Arg(
        "mtp_slot_hidden",
        "pool",
        torch.float32,
        (8, 4, 128),
        "per rank: [mtp_slots, hc_mult, hidden]",
        per_rank=True,
    ),
    Arg("weights", "weight", None, (), "handle"),
    Arg("logits", "output", torch.float32, (8, 4, 2, 512), "[ranks, batch, seq, vocab]"),
    Arg(
        "hidden",
        "output",
        torch.float32,
        (8, 4, 2, 4, 128),
        "[ranks, batch, seq, hc_mult, hidden]",
    ),
    Arg("draft_ids", "output", torch.int64, (8, 4, 1), "[ranks, batch, k]"),
)
KERNEL = KernelABI(spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE)


@dataclass(frozen=True)
class Outputs:
    """Views of the wrapper's output buffers, valid until its next launch."""

    # [ranks, batch, seq, vocab] float32: main-model logits of rows [tail, drafts...]
    logits: torch.Tensor
    # [ranks, batch, seq, hc_mult, hidden] float32: pre-hc_head streams of every row token
    hidden: torch.Tensor
    # [ranks, batch, k] int64: the MTP drafts this step verified
    draft_ids: torch.Tensor


class DecodeB4S2:
    """Launch wrapper of decode_b4s2: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch.
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND):
        self.device = torch.device(device)
        self.backend = get_backend(backend)
        self.slot_ids = torch.zeros((8, 4), dtype=torch.int32, device=self.device)
        self.slot_gens = torch.zeros((8, 4), dtype=torch.int64, device=self.device)
        self.block_table_ori = torch.zeros((8, 4, 3), dtype=torch.int32, device=self.device)
        self.block_table_cmp_c128 = torch.zeros((8, 4, 128), dtype=torch.int32, device=self.device)
        self.block_table_cmp_c4 = torch.zeros((8, 4, 128), dtype=torch.int32, device=self.device)
        self.block_table_idx = torch.zeros((8, 4, 128), dtype=torch.int32, device=self.device)
        self.block_table_hca_state = torch.zeros((8, 4, 16), dtype=torch.int32, device=self.device)
        self.block_table_csa_state = torch.zeros((8, 4, 2), dtype=torch.int32, device=self.device)
        self.block_table_csa_inner_state = torch.zeros(
            (8, 4, 2), dtype=torch.int32, device=self.device,
        )
        self.logits = torch.zeros((8, 4, 2, 512), dtype=torch.float32, device=self.device)
        self.hidden = torch.zeros((8, 4, 2, 4, 128), dtype=torch.float32, device=self.device)
        self.draft_ids = torch.zeros((8, 4, 1), dtype=torch.int64, device=self.device)

    def marshal(
        self,
        *,
        slot_ids: HostData,
        slot_gens: HostData,
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
    ) -> tuple:
        """Check and stage every argument; return the positional tuple of the launch."""
        return (
            stage(self.slot_ids, slot_ids, ARGS[0]),
            stage(self.slot_gens, slot_gens, ARGS[1]),
            stage(self.block_table_ori, block_table_ori, ARGS[2]),
            stage(self.block_table_cmp_c128, block_table_cmp_c128, ARGS[3]),
            stage(self.block_table_cmp_c4, block_table_cmp_c4, ARGS[4]),
            stage(self.block_table_idx, block_table_idx, ARGS[5]),
            stage(self.block_table_hca_state, block_table_hca_state, ARGS[6]),
            stage(self.block_table_csa_state, block_table_csa_state, ARGS[7]),
            stage(self.block_table_csa_inner_state, block_table_csa_inner_state, ARGS[8]),
            check_per_rank(pools.ori, ARGS[9], RANKS),
            check_per_rank(pools.cmp_c128, ARGS[10], RANKS),
            check_per_rank(pools.cmp_c4, ARGS[11], RANKS),
            check_per_rank(pools.idx, ARGS[12], RANKS),
            check_per_rank(pools.hca_state, ARGS[13], RANKS),
            check_per_rank(pools.csa_state, ARGS[14], RANKS),
            check_per_rank(pools.csa_inner_state, ARGS[15], RANKS),
            check_per_rank(mtp.slots, ARGS[16], RANKS),
            check_per_rank(mtp.hidden, ARGS[17], RANKS),
            check_weights(weights, FINGERPRINT, SPEC_NAME),
            self.logits,
            self.hidden,
            self.draft_ids,
        )

    def launch(self, **kwargs: object) -> Outputs:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**kwargs))

    def run(self, args: tuple) -> Outputs:
        """Run the kernel on arguments marshal() built."""
        self.backend.launch(KERNEL, args)
        return Outputs(logits=self.logits, hidden=self.hidden, draft_ids=self.draft_ids)
