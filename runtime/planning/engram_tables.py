"""Where DeepSeek V4.1's Engram tables live, and what they cost a rank's device and a
node's host. Torch-free.

One table per Engram layer, `rows` x head_dim values, as released fp8 e4m3 with an e8m0
scale byte per 32 values (a row: head_dim x (1 + 1/32) bytes; 264 at 256), else in the
compute dtype. V4.1-Flash: 384,006,168 + 384,016,682 rows, 188.83 GiB: more than every
other weight together. Two placements, as vLLM's --engram-config offers them:

    device   every table sharded across the replica's ranks by row range: a rank holds
             ceil(rows / ranks) rows of each table and answers the lookups of its range
             (device bytes per rank ~ tables / ranks; nothing on the host)
    host     one copy per node in host shared memory, every rank of the node reading the
             rows its step looks up (no device bytes; the tables' bytes once per node)

Either way a step gathers the same rows onto the device (the memory plan's workspace
counts them); what differs is whether the tables take the cache's device memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from contract.checkpoint_layout import ENGRAM_SCALE_GROUP
from contract.model_args import ModelArgs

PLACEMENTS = ("device", "host")
DEFAULT_PLACEMENT = "host"      # vLLM's default: the tables offloaded to the CPU
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def check_placement(placement: str) -> str:
    """`placement`, or ValueError naming the ones there are."""
    if placement not in PLACEMENTS:
        raise ValueError(f"--engram-placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    return placement


@dataclass(frozen=True)
class EngramTables:
    layers: tuple[int, ...]     # the Engram layers, one table each
    rows: tuple[int, ...]       # rows of each layer's table
    row_bytes: int              # one row with its scales, as the device or host holds it
    format: str                 # "fp8" (e4m3 + e8m0 per 32) | "unquantized"

    @classmethod
    def of(cls, spec: ModuleType) -> EngramTables:
        """The tables of a spec (none for V4 or a V4.1 without Engram layers)."""
        args = ModelArgs.from_config(spec.architecture.CONFIG)
        fmt = getattr(spec.contract, "WEIGHTS_ENGRAM", "unquantized")
        width = args.engram_head_dim
        row = width + width // ENGRAM_SCALE_GROUP if fmt == "fp8" \
            else width * DTYPE_BYTES[spec.contract.DTYPE]
        return cls(args.engram_layers, args.engram_num_embeddings, row, fmt)

    def __bool__(self) -> bool:
        return bool(self.layers)

    @property
    def bytes(self) -> int:
        """Every table, whole."""
        return sum(self.rows) * self.row_bytes

    def shard_rows(self, ranks: int) -> tuple[int, ...]:
        """Rows of each table the fullest rank holds when sharded by row range."""
        return tuple(-(-rows // ranks) for rows in self.rows)

    def device_bytes(self, placement: str, ranks: int) -> int:
        """Device bytes per rank of `placement` on `ranks` ranks (the fullest rank)."""
        if check_placement(placement) == "host":
            return 0
        return sum(self.shard_rows(ranks)) * self.row_bytes

    def host_bytes(self, placement: str) -> int:
        """Host bytes per node of `placement`: one shared copy of every table on host."""
        return self.bytes if check_placement(placement) == "host" else 0
