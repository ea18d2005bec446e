# @generated from specs/reference.yaml by codegen — do not edit
"""Decode B8S1: 8 rows of 1 token per rank, no speculation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.abi import Arg, HostData, KernelABI, check_per_rank, check_weights, stage
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, RANKS, TILE
from ..pools import GROUPS, Pools

SPEC_NAME = "reference"
NAME = "decode_b8s1"
KIND = "decode"
ROWS = 8  # decode batch per rank
SEQ = 1
K = 0

# Positional ABI, in launch order. Shapes are per rank for per_rank args; None is a
# dimension fixed at run time (a pool's block count).
ARGS = (
    Arg("token_ids", "input", torch.int64, (8, 8, 1), "[ranks, batch, seq]"),
    Arg("positions", "metadata", torch.int32, (8, 8), "[ranks, batch]"),
    Arg("row_lens", "metadata", torch.int32, (8, 8), "[ranks, batch]"),
    Arg("block_table_ori", "metadata", torch.int32, (8, 8, 3), "[ranks, batch, 3]"),
    Arg("block_table_cmp_c128", "metadata", torch.int32, (8, 8, 128), "[ranks, batch, 128]"),
    Arg("block_table_cmp_c4", "metadata", torch.int32, (8, 8, 128), "[ranks, batch, 128]"),
    Arg("block_table_idx", "metadata", torch.int32, (8, 8, 128), "[ranks, batch, 128]"),
    Arg("block_table_hca_state", "metadata", torch.int32, (8, 8, 16), "[ranks, batch, 16]"),
    Arg("block_table_csa_state", "metadata", torch.int32, (8, 8, 2), "[ranks, batch, 2]"),
    Arg("block_table_csa_inner_state", "metadata", torch.int32, (8, 8, 2), "[ranks, batch, 2]"),
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
    Arg("weights", "weight", None, (), "handle"),
    Arg("logits", "output", torch.float32, (8, 8, 1, 512), "[ranks, batch, seq, vocab]"),
)
KERNEL = KernelABI(spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE)


@dataclass(frozen=True)
class Outputs:
    """Views of the wrapper's output buffers, valid until its next launch."""

    # [ranks, batch, seq, vocab] float32: logits of every row token
    logits: torch.Tensor


class DecodeB8S1:
    """Launch wrapper of decode_b8s1: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch.
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND):
        self.device = torch.device(device)
        self.backend = get_backend(backend)
        self.token_ids = torch.zeros((8, 8, 1), dtype=torch.int64, device=self.device)
        self.positions = torch.zeros((8, 8), dtype=torch.int32, device=self.device)
        self.row_lens = torch.zeros((8, 8), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros((8, 8, 3), dtype=torch.int32, device=self.device)
        self.block_table_cmp_c128 = torch.zeros((8, 8, 128), dtype=torch.int32, device=self.device)
        self.block_table_cmp_c4 = torch.zeros((8, 8, 128), dtype=torch.int32, device=self.device)
        self.block_table_idx = torch.zeros((8, 8, 128), dtype=torch.int32, device=self.device)
        self.block_table_hca_state = torch.zeros((8, 8, 16), dtype=torch.int32, device=self.device)
        self.block_table_csa_state = torch.zeros((8, 8, 2), dtype=torch.int32, device=self.device)
        self.block_table_csa_inner_state = torch.zeros(
            (8, 8, 2), dtype=torch.int32, device=self.device,
        )
        self.logits = torch.zeros((8, 8, 1, 512), dtype=torch.float32, device=self.device)

    def marshal(
        self,
        *,
        token_ids: HostData,
        positions: HostData,
        row_lens: HostData,
        block_table_ori: HostData,
        block_table_cmp_c128: HostData,
        block_table_cmp_c4: HostData,
        block_table_idx: HostData,
        block_table_hca_state: HostData,
        block_table_csa_state: HostData,
        block_table_csa_inner_state: HostData,
        pools: Pools,
        weights: object,
    ) -> tuple:
        """Check and stage every argument; return the positional tuple of the launch."""
        return (
            stage(self.token_ids, token_ids, ARGS[0]),
            stage(self.positions, positions, ARGS[1]),
            stage(self.row_lens, row_lens, ARGS[2]),
            stage(self.block_table_ori, block_table_ori, ARGS[3]),
            stage(self.block_table_cmp_c128, block_table_cmp_c128, ARGS[4]),
            stage(self.block_table_cmp_c4, block_table_cmp_c4, ARGS[5]),
            stage(self.block_table_idx, block_table_idx, ARGS[6]),
            stage(self.block_table_hca_state, block_table_hca_state, ARGS[7]),
            stage(self.block_table_csa_state, block_table_csa_state, ARGS[8]),
            stage(self.block_table_csa_inner_state, block_table_csa_inner_state, ARGS[9]),
            check_per_rank(pools.ori, ARGS[10], RANKS),
            check_per_rank(pools.cmp_c128, ARGS[11], RANKS),
            check_per_rank(pools.cmp_c4, ARGS[12], RANKS),
            check_per_rank(pools.idx, ARGS[13], RANKS),
            check_per_rank(pools.hca_state, ARGS[14], RANKS),
            check_per_rank(pools.csa_state, ARGS[15], RANKS),
            check_per_rank(pools.csa_inner_state, ARGS[16], RANKS),
            check_weights(weights, FINGERPRINT, SPEC_NAME),
            self.logits,
        )

    def launch(self, **kwargs: object) -> Outputs:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**kwargs))

    def run(self, args: tuple) -> Outputs:
        """Run the kernel on arguments marshal() built."""
        self.backend.launch(KERNEL, args)
        return Outputs(logits=self.logits)
