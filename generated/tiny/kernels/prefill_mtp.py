# @generated from specs/tiny.yaml by codegen — do not edit
"""MTP prefill: rebuilds the MTP layer's sliding KV from the last 128 pre-hc_head rows of a
main prefill and the tokens that follow them.
"""
from __future__ import annotations

import torch

from runtime.abi import (
    Arg,
    HostData,
    KernelABI,
    check_per_rank,
    check_tensor,
    check_weights,
    stage,
)
from runtime.backends import get_backend

from ..architecture import FINGERPRINT
from ..contract import BACKEND, RANKS, TILE
from ..pools import GROUPS, Pools

SPEC_NAME = "tiny"
NAME = "prefill_mtp"
KIND = "prefill_mtp"
ROWS = 4  # prefill slots per rank

# Positional ABI, in launch order. Shapes are per rank for per_rank args; None is a
# dimension fixed at run time (a pool's block count).
ARGS = (
    Arg(
        "mtp_hidden",
        "input",
        torch.float32,
        (8, 4, 128, 4, 256),
        "[ranks, slots, mtp_window, hc_mult, hidden]",
    ),
    Arg("next_ids", "input", torch.int64, (8, 4, 128), "[ranks, slots, mtp_window]"),
    Arg("start_pos", "metadata", torch.int32, (8, 4), "[ranks, slots]"),
    Arg("num_rows", "metadata", torch.int32, (8, 4), "[ranks, slots]"),
    Arg("block_table_ori", "metadata", torch.int32, (8, 4, 3), "[ranks, slots, 3]"),
    Arg(
        "pool_ori",
        "pool",
        torch.float32,
        (5, None, 128, 128),
        "per rank: [layers, blocks, rows, width]",
        per_rank=True,
    ),
    Arg("weights", "weight", None, (), "handle"),
)
KERNEL = KernelABI(spec=SPEC_NAME, name=NAME, kind=KIND, args=ARGS, groups=GROUPS, tile=TILE)


class PrefillMtp:
    """Launch wrapper of prefill_mtp: stage, check, launch through a backend.

    Staging and output buffers are allocated once here and reused by every launch.
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = BACKEND):
        self.device = torch.device(device)
        self.backend = get_backend(backend)
        self.next_ids = torch.zeros((8, 4, 128), dtype=torch.int64, device=self.device)
        self.start_pos = torch.zeros((8, 4), dtype=torch.int32, device=self.device)
        self.num_rows = torch.zeros((8, 4), dtype=torch.int32, device=self.device)
        self.block_table_ori = torch.zeros((8, 4, 3), dtype=torch.int32, device=self.device)

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
    ) -> tuple:
        """Check and stage every argument; return the positional tuple of the launch."""
        return (
            check_tensor(mtp_hidden, ARGS[0], ARGS[0].shape, self.device),
            stage(self.next_ids, next_ids, ARGS[1]),
            stage(self.start_pos, start_pos, ARGS[2]),
            stage(self.num_rows, num_rows, ARGS[3]),
            stage(self.block_table_ori, block_table_ori, ARGS[4]),
            check_per_rank(pools.ori, ARGS[5], RANKS),
            check_weights(weights, FINGERPRINT, SPEC_NAME),
        )

    def launch(self, **kwargs: object) -> None:
        """Marshal the keywords of marshal(), then run the kernel on the backend."""
        return self.run(self.marshal(**kwargs))

    def run(self, args: tuple) -> None:
        """Run the kernel on arguments marshal() built."""
        self.backend.launch(KERNEL, args)
