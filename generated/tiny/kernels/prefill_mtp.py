# @generated from specs/tiny.yaml by codegen — do not edit
"""MTP prefill: rebuilds the MTP layer's sliding KV from the last 128 pre-hc_head rows of a
main prefill and the tokens that follow them.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from runtime.device.abi import Arg, HostData, KernelABI, check_tensor, check_weights, stage
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, CONTEXT_BUCKETS, RANKS, TILE
from ..pools import GROUPS, Pools

SPEC_NAME = "tiny"
NAME = "prefill_mtp"
KIND = "prefill_mtp"
ROWS = 4  # prefill slots per rank

# The ABI, in launch order. None is a dimension fixed at run time: the ranks the wrapper
# drives, a pool's block count (+1: the scratch page).
ARGS = (
    Arg(
        "mtp_hidden",
        "input",
        torch.float32,
        (None, 4, 128, 4, 256),
        "[ranks, slots, mtp_window, hc_mult, hidden]",
    ),
    Arg("next_ids", "input", torch.int64, (None, 4, 128), "[ranks, slots, mtp_window]"),
    Arg("start_pos", "metadata", torch.int32, (None, 4), "[ranks, slots]"),
    Arg("num_rows", "metadata", torch.int32, (None, 4), "[ranks, slots]"),
    Arg("block_table_ori", "metadata", torch.int32, (None, 4, 3), "[ranks, slots, 3]"),
    Arg(
        "pool_ori",
        "pool",
        torch.float32,
        (None, 5, None, 128, 128),
        "[ranks, layers, blocks + 1, rows, width]",
    ),
    Arg("weights", "weight", None, (), "handle"),
)
KERNEL = KernelABI(
    spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE,
    context_buckets=CONTEXT_BUCKETS,
)


class Args(NamedTuple):
    """One launch's arguments by name, as a backend receives them."""

    # [ranks, slots, mtp_window, hc_mult, hidden]: the main prefill's mtp_hidden output
    mtp_hidden: torch.Tensor
    # [ranks, slots, mtp_window]: token at position i+1 for each window row i
    next_ids: torch.Tensor
    # [ranks, slots]: position of window row 0
    start_pos: torch.Tensor
    # [ranks, slots]: window rows whose next token is known; 0 marks an empty slot
    num_rows: torch.Tensor
    # [ranks, slots, 3]: rank-local ori block ids per row; -1 (the scratch page) past the last
    # block
    block_table_ori: torch.Tensor
    # [ranks, layers, blocks + 1, rows, width]: sliding-window KV of every layer, the MTP layer
    # included
    pool_ori: torch.Tensor
    # handle: loaded model weights; their fingerprint must match this spec's model
    weights: object
    # host copies of the staged metadata, for decisions a backend makes before launching
    host: dict[str, np.ndarray]


class PrefillMtp:
    """Launch wrapper of prefill_mtp: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch;
    `ranks` is how many ranks of the replica this wrapper drives (all of them in one
    process, one in a rank worker).
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND,
                 ranks: int = RANKS):
        self.device, self.ranks = torch.device(device), ranks
        self.backend = get_backend(backend)
        self.next_ids = torch.zeros((self.ranks, 4, 128), dtype=torch.int64, device=self.device)
        self.start_pos = torch.zeros((self.ranks, 4), dtype=torch.int32, device=self.device)
        self.num_rows = torch.zeros((self.ranks, 4), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros(
            (self.ranks, 4, 3), dtype=torch.int32, device=self.device,
        )

    def marshal(
        self,
        *,
        mtp_hidden: torch.Tensor,
        next_ids: HostData,
        start_pos: HostData,
        num_rows: HostData,
        block_table_ori: HostData,
        pools: Pools,
        weights: object,
    ) -> Args:
        """Check and stage every argument; return the launch's Args."""
        return Args(
            mtp_hidden=check_tensor(mtp_hidden, ARGS[0], self._shape(ARGS[0]), self.device),
            next_ids=stage(self.next_ids, next_ids, ARGS[1]),
            start_pos=stage(self.start_pos, start_pos, ARGS[2]),
            num_rows=stage(self.num_rows, num_rows, ARGS[3]),
            block_table_ori=stage(self.block_table_ori, block_table_ori, ARGS[4]),
            pool_ori=check_tensor(pools.ori, ARGS[5], self._shape(ARGS[5]), self.device),
            weights=check_weights(weights, FINGERPRINT, SPEC_NAME),
            host={
                "start_pos": np.asarray(start_pos),
                "num_rows": np.asarray(num_rows),
                "block_table_ori": np.asarray(block_table_ori),
            },
        )

    def _shape(self, arg: Arg) -> tuple[int | None, ...]:
        """An argument's shape with the ranks this wrapper drives in front."""
        return (self.ranks, *arg.shape[1:])

    def launch(self, **kwargs: object) -> None:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**kwargs))

    def run(self, args: Args) -> None:
        """Run the kernel on arguments marshal() built."""
        self.backend.launch(KERNEL, args)
