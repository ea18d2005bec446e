# @generated from specs/deepseek-v4-flash.yaml by codegen — do not edit
"""Decode B8S1: 8 rows of 1 token per rank, no speculation.
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
from ..pools import GROUPS, Pools

SPEC_NAME = "deepseek-v4-flash"
NAME = "decode_b8s1"
KIND = "decode"
ROWS = 8  # decode batch per rank
SEQ = 1
K = 0

# The ABI, in launch order. None is a dimension fixed at run time: the ranks the wrapper
# drives, a pool's block count (+1: the scratch page).
ARGS = (
    Arg("token_ids", "input", torch.int64, (None, 8, 1), "[ranks, batch, seq]"),
    Arg("positions", "metadata", torch.int32, (None, 8), "[ranks, batch]"),
    Arg("row_lens", "metadata", torch.int32, (None, 8), "[ranks, batch]"),
    Arg("block_table_ori", "metadata", torch.int32, (None, 8, 3), "[ranks, batch, 3]"),
    Arg("block_table_cmp_c128", "metadata", torch.int32, (None, 8, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_cmp_c4", "metadata", torch.int32, (None, 8, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_idx", "metadata", torch.int32, (None, 8, 8192), "[ranks, batch, 8192]"),
    Arg("block_table_hca_state", "metadata", torch.int32, (None, 8, 16), "[ranks, batch, 16]"),
    Arg("block_table_csa_state", "metadata", torch.int32, (None, 8, 2), "[ranks, batch, 2]"),
    Arg("block_table_csa_inner_state", "metadata", torch.int32, (None, 8, 2), "[ranks, batch, 2]"),
    Arg(
        "pool_ori",
        "pool",
        torch.bfloat16,
        (None, 44, None, 128, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c128",
        "pool",
        torch.bfloat16,
        (None, 20, None, 1, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c4",
        "pool",
        torch.bfloat16,
        (None, 21, None, 32, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_idx",
        "pool",
        torch.bfloat16,
        (None, 21, None, 32, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_hca_state",
        "pool",
        torch.float32,
        (None, 20, None, 8, 1024),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_state",
        "pool",
        torch.float32,
        (None, 21, None, 4, 2048),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_inner_state",
        "pool",
        torch.float32,
        (None, 21, None, 4, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg("weights", "weight", None, (), "handle"),
    Arg("context", "scalar", None, (), "int"),
    Arg("logits", "output", torch.float32, (None, 8, 1, 129280), "[ranks, batch, seq, vocab]"),
)
KERNEL = KernelABI(
    spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE,
    context_buckets=CONTEXT_BUCKETS,
)


class Args(NamedTuple):
    """One launch's arguments by name, as a backend receives them."""

    # [ranks, batch, seq]: input tokens per row
    token_ids: torch.Tensor
    # [ranks, batch]: position of each row's first token
    positions: torch.Tensor
    # [ranks, batch]: tokens per row: 1, or 0 for an empty row
    row_lens: torch.Tensor
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
    # handle: loaded model weights; their fingerprint must match this spec's model
    weights: object
    # int: positions the longest row reaches (its position + seq): the decode graph of the smallest
    # context bucket holding it serves the launch
    context: int
    # [ranks, batch, seq, vocab]: logits of every row token
    logits: torch.Tensor
    # host copies of the staged metadata, for decisions a backend makes before launching
    host: dict[str, np.ndarray]


@dataclass(frozen=True)
class Outputs:
    """Views of the wrapper's output buffers, valid until its next launch."""

    # [ranks, batch, seq, vocab] float32: logits of every row token
    logits: torch.Tensor


class DecodeB8S1:
    """Launch wrapper of decode_b8s1: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch;
    `ranks` is how many ranks of the replica this wrapper drives (all of them in one
    process, one in a rank worker).
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND,
                 ranks: int = RANKS):
        self.device, self.ranks = torch.device(device), ranks
        self.backend = get_backend(backend)
        self.token_ids = torch.zeros((self.ranks, 8, 1), dtype=torch.int64, device=self.device)
        self.positions = torch.zeros((self.ranks, 8), dtype=torch.int32, device=self.device)
        self.row_lens = torch.zeros((self.ranks, 8), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros(
            (self.ranks, 8, 3), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c128 = torch.zeros(
            (self.ranks, 8, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c4 = torch.zeros(
            (self.ranks, 8, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_idx = torch.zeros(
            (self.ranks, 8, 8192), dtype=torch.int32, device=self.device,
        )
        self.block_table_hca_state = torch.zeros(
            (self.ranks, 8, 16), dtype=torch.int32, device=self.device,
        )
        self.block_table_csa_state = torch.zeros(
            (self.ranks, 8, 2), dtype=torch.int32, device=self.device,
        )
        self.block_table_csa_inner_state = torch.zeros(
            (self.ranks, 8, 2), dtype=torch.int32, device=self.device,
        )
        self.logits = torch.zeros(
            (self.ranks, 8, 1, 129280), dtype=torch.float32, device=self.device,
        )

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
        context: int,
    ) -> Args:
        """Check and stage every argument; return the launch's Args."""
        return Args(
            token_ids=stage(self.token_ids, token_ids, ARGS[0]),
            positions=stage(self.positions, positions, ARGS[1]),
            row_lens=stage(self.row_lens, row_lens, ARGS[2]),
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
            weights=check_weights(weights, FINGERPRINT, SPEC_NAME),
            context=context,
            logits=self.logits,
            host={
                "positions": np.asarray(positions),
                "row_lens": np.asarray(row_lens),
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
        return Outputs(logits=self.logits)
