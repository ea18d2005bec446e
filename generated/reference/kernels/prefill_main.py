# @generated from specs/reference.yaml by codegen — do not edit
"""Main-model prefill: up to 4 chunks per rank, each a dynamic extent of at most 8192 rows
walked in 128-row tiles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from runtime.device.abi import (
    Arg,
    HostData,
    KernelABI,
    check_extent,
    check_tensor,
    check_weights,
    stage,
)
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, CONTEXT_BUCKETS, MAX_EXTENT, RANKS, TILE
from ..pools import GROUPS, Pools

SPEC_NAME = "reference"
NAME = "prefill_main"
KIND = "prefill_main"
ROWS = 4  # prefill slots per rank

# The ABI, in launch order. None is a dimension fixed at run time: the ranks the wrapper
# drives, the extent, a pool's block count (+1: the scratch page).
ARGS = (
    Arg("token_ids", "input", torch.int64, (None, 4, None), "[ranks, slots, extent]"),
    Arg("start_pos", "metadata", torch.int32, (None, 4), "[ranks, slots]"),
    Arg("chunk_lens", "metadata", torch.int32, (None, 4), "[ranks, slots]"),
    Arg("block_table_ori", "metadata", torch.int32, (None, 4, 3), "[ranks, slots, 3]"),
    Arg("block_table_cmp_c128", "metadata", torch.int32, (None, 4, 128), "[ranks, slots, 128]"),
    Arg("block_table_cmp_c4", "metadata", torch.int32, (None, 4, 128), "[ranks, slots, 128]"),
    Arg("block_table_idx", "metadata", torch.int32, (None, 4, 128), "[ranks, slots, 128]"),
    Arg("block_table_hca_state", "metadata", torch.int32, (None, 4, 16), "[ranks, slots, 16]"),
    Arg("block_table_csa_state", "metadata", torch.int32, (None, 4, 2), "[ranks, slots, 2]"),
    Arg("block_table_csa_inner_state", "metadata", torch.int32, (None, 4, 2), "[ranks, slots, 2]"),
    Arg(
        "pool_ori",
        "pool",
        torch.float32,
        (None, 5, None, 128, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c128",
        "pool",
        torch.float32,
        (None, 1, None, 1, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_cmp_c4",
        "pool",
        torch.float32,
        (None, 2, None, 32, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_idx",
        "pool",
        torch.float32,
        (None, 2, None, 32, 64),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_hca_state",
        "pool",
        torch.float32,
        (None, 1, None, 8, 256),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_state",
        "pool",
        torch.float32,
        (None, 2, None, 4, 512),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg(
        "pool_csa_inner_state",
        "pool",
        torch.float32,
        (None, 2, None, 4, 256),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg("weights", "weight", None, (), "handle"),
    Arg("extent", "scalar", None, (), "int"),
    Arg("logits", "output", torch.float32, (None, 4, 512), "[ranks, slots, vocab]"),
    Arg(
        "mtp_hidden",
        "output",
        torch.float32,
        (None, 4, 128, 4, 128),
        "[ranks, slots, mtp_window, hc_mult, hidden]",
    ),
)
KERNEL = KernelABI(
    spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE,
    context_buckets=CONTEXT_BUCKETS,
)


class Args(NamedTuple):
    """One launch's arguments by name, as a backend receives them."""

    # [ranks, slots, extent]: chunk tokens per slot, padded to the extent
    token_ids: torch.Tensor
    # [ranks, slots]: position of each chunk's first token (its cached context length)
    start_pos: torch.Tensor
    # [ranks, slots]: valid tokens per slot; 0 marks an empty slot
    chunk_lens: torch.Tensor
    # [ranks, slots, 3]: rank-local ori block ids per row; -1 (the scratch page) past the last
    # block
    block_table_ori: torch.Tensor
    # [ranks, slots, 128]: rank-local cmp_c128 block ids per row; -1 (the scratch page) past the
    # last block
    block_table_cmp_c128: torch.Tensor
    # [ranks, slots, 128]: rank-local cmp_c4 block ids per row; -1 (the scratch page) past the last
    # block
    block_table_cmp_c4: torch.Tensor
    # [ranks, slots, 128]: rank-local idx block ids per row; -1 (the scratch page) past the last
    # block
    block_table_idx: torch.Tensor
    # [ranks, slots, 16]: rank-local hca_state block ids per row; -1 (the scratch page) past the
    # last block
    block_table_hca_state: torch.Tensor
    # [ranks, slots, 2]: rank-local csa_state block ids per row; -1 (the scratch page) past the
    # last block
    block_table_csa_state: torch.Tensor
    # [ranks, slots, 2]: rank-local csa_inner_state block ids per row; -1 (the scratch page) past
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
    # int: padded rows per slot: a tile multiple
    extent: int
    # [ranks, slots, vocab]: logits of each slot's last valid row
    logits: torch.Tensor
    # [ranks, slots, mtp_window, hc_mult, hidden]: pre-hc_head streams of each slot's last
    # min(mtp_window, chunk_len) rows, row 0 first
    mtp_hidden: torch.Tensor
    # host copies of the staged metadata, for decisions a backend makes before launching
    host: dict[str, np.ndarray]


@dataclass(frozen=True)
class Outputs:
    """Views of the wrapper's output buffers, valid until its next launch."""

    # [ranks, slots, vocab] float32: logits of each slot's last valid row
    logits: torch.Tensor
    # [ranks, slots, mtp_window, hc_mult, hidden] float32: pre-hc_head streams of each slot's last
    # min(mtp_window, chunk_len) rows, row 0 first
    mtp_hidden: torch.Tensor


class PrefillMain:
    """Launch wrapper of prefill_main: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch;
    `ranks` is how many ranks of the replica this wrapper drives (all of them in one
    process, one in a rank worker).
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND,
                 ranks: int = RANKS):
        self.device, self.ranks = torch.device(device), ranks
        self.backend = get_backend(backend)
        self.token_ids = torch.zeros(
            (self.ranks, 4, MAX_EXTENT), dtype=torch.int64, device=self.device,
        )
        self.start_pos = torch.zeros((self.ranks, 4), dtype=torch.int32, device=self.device)
        self.chunk_lens = torch.zeros((self.ranks, 4), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros(
            (self.ranks, 4, 3), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c128 = torch.zeros(
            (self.ranks, 4, 128), dtype=torch.int32, device=self.device,
        )
        self.block_table_cmp_c4 = torch.zeros(
            (self.ranks, 4, 128), dtype=torch.int32, device=self.device,
        )
        self.block_table_idx = torch.zeros(
            (self.ranks, 4, 128), dtype=torch.int32, device=self.device,
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
        self.logits = torch.zeros((self.ranks, 4, 512), dtype=torch.float32, device=self.device)
        self.mtp_hidden = torch.zeros(
            (self.ranks, 4, 128, 4, 128), dtype=torch.float32, device=self.device,
        )

    def marshal(
        self,
        *,
        token_ids: HostData,
        start_pos: HostData,
        chunk_lens: HostData,
        block_table_ori: HostData,
        block_table_cmp_c128: HostData,
        block_table_cmp_c4: HostData,
        block_table_idx: HostData,
        block_table_hca_state: HostData,
        block_table_csa_state: HostData,
        block_table_csa_inner_state: HostData,
        pools: Pools,
        weights: object,
        extent: int,
    ) -> Args:
        """Check and stage every argument; return the launch's Args."""
        extent = check_extent(extent, TILE, MAX_EXTENT)
        return Args(
            token_ids=stage(self.token_ids[:, :, :extent], token_ids, ARGS[0]),
            start_pos=stage(self.start_pos, start_pos, ARGS[1]),
            chunk_lens=stage(self.chunk_lens, chunk_lens, ARGS[2]),
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
            extent=extent,
            logits=self.logits,
            mtp_hidden=self.mtp_hidden,
            host={
                "start_pos": np.asarray(start_pos),
                "chunk_lens": np.asarray(chunk_lens),
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
        return Outputs(logits=self.logits, mtp_hidden=self.mtp_hidden)
