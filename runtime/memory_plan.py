"""One rank's device memory, planned from the spec alone: the weights it holds by kind,
a workspace for the largest launch, and what is left for the cache pools. Torch-free.

    usable     = device memory x gpu_memory_utilization
    weights    = the replicated dense tensors + this rank's routed experts, each in the
                 form the device holds it (weights.format: as released, or the dtype)
    workspace  = an estimate of the largest launch's temporaries (see `workspace`)
    pools      = usable - weights - workspace        ("does not fit" when negative)

`v4serve plan` prints it; the engine sizes its pools by the same plan when given a
device memory (--device-memory, or a cuda/npu device's own), so the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from runtime.checkpoint_layout import (
    expected_shapes,
    is_fp8_projection,
    is_routed_expert,
    keeps_float32,
)
from runtime.model.args import ModelArgs

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP8_BLOCK, FP4_GROUP = 128, 32
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """"141GiB", "192GB", "80e9", "1073741824" -> bytes."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().replace(" ", "")
    digits = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(digits):]
    if unit not in UNITS or not digits:
        raise ValueError(f"{text!r}: a size is a number and a unit (B, KB, MB, GB, TB, "
                         "KiB, MiB, GiB, TiB), e.g. 141GiB")
    return int(float(digits) * UNITS[unit])


@dataclass(frozen=True)
class WeightBytes:
    dense: int              # replicated: every rank holds them all
    experts: int            # this rank's share of the routed experts

    @property
    def total(self) -> int:
        return self.dense + self.experts


def weight_bytes(spec: ModuleType, ranks: int | None = None) -> WeightBytes:
    """What one rank holds once the spec's checkpoint is loaded, on the spec's ranks or
    on `ranks` (the routed experts split over them)."""
    c = spec.contract
    args = ModelArgs.from_config(spec.architecture.CONFIG)
    held = c.WEIGHTS_FORMAT == "as_released"
    dense = experts = 0
    for name, shape in expected_shapes(args).items():
        if is_routed_expert(name):
            experts += _expert_bytes(shape, held and c.WEIGHTS_EXPERTS == "fp4", c.DTYPE)
        else:
            fp8 = held and c.WEIGHTS_DENSE == "fp8" and is_fp8_projection(name, shape)
            dense += _dense_bytes(name, shape, fp8, c.DTYPE)
    return WeightBytes(dense, experts // (ranks or c.EP))


def _dense_bytes(name: str, shape: tuple[int, ...], fp8: bool, dtype: str) -> int:
    n = _numel(shape)
    if fp8:                                   # e4m3 bytes and one e8m0 byte per block
        return n + -(-shape[0] // FP8_BLOCK) * -(-shape[1] // FP8_BLOCK)
    if name.endswith("tid2eid"):              # expert ids, int32 as released
        return 4 * n
    return n * (4 if keeps_float32(name, len(shape)) else DTYPE_BYTES[dtype])


def _expert_bytes(shape: tuple[int, ...], fp4: bool, dtype: str) -> int:
    n = _numel(shape)
    return n // 2 + n // FP4_GROUP if fp4 else n * DTYPE_BYTES[dtype]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def workspace(spec: ModuleType, limits: Any, ranks: int | None = None) -> int:
    """Temporaries of the largest launch, estimated from the shapes (not profiled):
    a prefill of max_num_batched_tokens rows (the mHC streams and their float32 mixes,
    queries and attention scores over the window and the selected entries), the logits
    of the widest launch, and one layer's routed experts of this rank dequantized into
    the compute dtype when they are held as FP4 (compiled graphs fuse the dequantization;
    --enforce-eager materializes float32 intermediates beyond this)."""
    c, cfg = spec.contract, spec.architecture.CONFIG
    args = ModelArgs.from_config(cfg)
    t, dtype = limits.max_num_batched_tokens, DTYPE_BYTES[c.DTYPE]
    streams = 6 * t * args.hc_mult * args.dim * 4
    queries = 3 * t * args.n_heads * args.head_dim * 4
    scores = 2 * t * args.n_heads * (cfg["sliding_window"] + args.index_topk) * 4
    rows = max(max(lay.batch * lay.seq for lay in c.DECODE_LAYOUTS.values())
               * c.DECODE_MICRO_BATCHES, c.SLOTS_PER_RANK)
    logits = 2 * rows * args.vocab_size * 4
    experts = 0
    if c.WEIGHTS_FORMAT == "as_released" and c.WEIGHTS_EXPERTS == "fp4":
        per_rank = args.n_experts // (ranks or c.EP)
        experts = per_rank * 3 * args.moe_inter * args.dim * dtype
    return streams + queries + scores + logits + experts


@dataclass(frozen=True)
class MemoryPlan:
    device_memory: int          # bytes of one rank's device
    utilization: float          # the share of it v4serve may use
    weights: WeightBytes
    workspace: int
    ranks: int                  # of the replica: the routed experts split over them

    @classmethod
    def of(cls, spec: ModuleType, device_memory: int, utilization: float, limits: Any,
           ranks: int | None = None) -> MemoryPlan:
        experts = spec.architecture.CONFIG["n_routed_experts"]
        ranks = ranks or spec.contract.RANKS
        if ranks < 1 or experts % ranks:
            raise ValueError(f"{ranks} ranks: the {experts} routed experts must split evenly")
        if not 0 < utilization <= 1:
            raise ValueError(f"gpu_memory_utilization {utilization}: must be in (0, 1]")
        return cls(device_memory, utilization, weight_bytes(spec, ranks),
                   workspace(spec, limits, ranks), ranks)

    @property
    def usable(self) -> int:
        return int(self.device_memory * self.utilization)

    @property
    def pool_budget(self) -> int:
        """Bytes left for the cache pools; negative when the rest does not fit."""
        return self.usable - self.weights.total - self.workspace

    @property
    def shortfall(self) -> int:
        """Bytes per rank missing before a single page of cache fits (0 if it fits)."""
        return max(0, -self.pool_budget)

    def as_dict(self) -> dict[str, Any]:
        return {"device_memory": self.device_memory, "gpu_memory_utilization": self.utilization,
                "usable": self.usable, "weights_dense": self.weights.dense,
                "weights_experts": self.weights.experts, "weights": self.weights.total,
                "workspace": self.workspace, "pool_budget": max(0, self.pool_budget),
                "shortfall": self.shortfall}

