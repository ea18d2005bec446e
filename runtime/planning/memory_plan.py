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

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from contract.checkpoint_layout import (
    FP4_GROUP,
    FP8_BLOCK,
    expected_shapes,
    is_fp8_projection,
    is_routed_expert,
    keeps_float32,
)
from contract.model_args import ModelArgs

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """"141GiB", "192GB", "80e9", "1073741824" -> bytes."""
    if isinstance(text, int):
        size = text
    else:
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*", text)
        try:
            size = int(float(match.group(1)) * UNITS[match.group(2).lower()])
        except (AttributeError, KeyError, ValueError, OverflowError):
            raise ValueError(f"{text!r}: a size is a number and a unit (B, KB, MB, GB, "
                             "TB, KiB, MiB, GiB, TiB), e.g. 141GiB") from None
    if size <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return size


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
    """Temporaries of the largest launch, estimated from the shapes (not profiled): a
    prefill of max_num_batched_tokens tokens T at the context bucket of max_model_len,
    as the compiled graphs compute it (all of a launch's tiles at once):

        streams    the mHC streams and their float32 mixes        6 T hc dim 4
        queries    q and its float32 copies                       3 T H D 4
        attention  scores over the window and the chosen entries  2 T H (window + topk) 4
        entries    the index_topk entries each query reads        2 T topk D 4
        indexer    scores over every compressed entry E of the    2 T E 4
                   bucket (E = bucket / 4), its keys per tile     T / tile E index_dim 4
        logits     the widest launch's rows x vocabulary          2 rows V 4
        experts    one layer's routed experts of the rank, held   experts_per_rank 3 inter
                   FP4, dequantized into the compute dtype        dim dtype_bytes

    The indexer and entry terms grow with the context: lower --max-num-batched-tokens
    (the prefill chunk) to shrink them."""
    c, cfg = spec.contract, spec.architecture.CONFIG
    a = ModelArgs.from_config(cfg)
    t = limits.max_num_batched_tokens
    bucket = min((b for b in c.CONTEXT_BUCKETS if b >= limits.max_model_len),
                 default=c.CONTEXT_BUCKETS[-1])
    csa = "csa" in {a.kind(layer) for layer in range(a.n_layers)}
    terms = [6 * t * a.hc_mult * a.dim * 4,
             3 * t * a.n_heads * a.head_dim * 4,
             2 * t * a.n_heads * (cfg["sliding_window"] + a.index_topk * csa) * 4]
    if csa:
        entries = bucket // 4
        terms += [2 * t * a.index_topk * a.head_dim * 4,
                  2 * t * entries * 4 + -(-t // c.TILE) * entries * a.index_head_dim * 4]
    rows = max(max(lay.batch * lay.seq for lay in c.DECODE_LAYOUTS.values())
               * c.DECODE_MICRO_BATCHES, c.SLOTS_PER_RANK)
    terms.append(2 * rows * a.vocab_size * 4)
    if c.WEIGHTS_FORMAT == "as_released" and c.WEIGHTS_EXPERTS == "fp4":
        per_rank = a.n_experts // (ranks or c.EP)
        terms.append(per_rank * 3 * a.moe_inter * a.dim * DTYPE_BYTES[c.DTYPE])
    return sum(terms)


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
        ranks = spec.contract.RANKS if ranks is None else ranks
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

