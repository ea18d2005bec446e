"""One rank's device memory, planned from the spec alone: the weights it holds by kind,
a workspace for the largest launch, and what is left for the cache pools. Torch-free.

    usable     = device memory x gpu_memory_utilization
    weights    = the replicated dense tensors + this rank's routed experts, each in the
                 form the device holds it (weights.format: as released, or the dtype),
                 + V4.1's Engram rows this rank holds (none with --engram-placement
                 host; runtime/planning/engram_tables.py)
    workspace  = the largest launch's temporaries, estimated and checked against
                 the rehearsal's measurement (see `workspace`)
    pools      = usable - weights - workspace        ("does not fit" when negative)

`v4serve plan` prints it; the engine sizes its pools by the same plan when given a
device memory (--device-memory, or a cuda/npu device's own), so the two agree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from contract.abi import ATTENTION_BAND, INDEXER_TILES
from contract.checkpoint_layout import (
    FP4_GROUP,
    STACK_CHUNK,
    expected_shapes,
    fp8_block,
    is_engram_table,
    is_fp8_projection,
    is_routed_expert,
    is_v41_fp8_projection,
    keeps_float32,
)
from contract.model_args import ModelArgs
from runtime.planning.engram_tables import DEFAULT_PLACEMENT, EngramTables

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
    engram: int = 0         # this rank's rows of V4.1's Engram tables (0: on the host)

    @property
    def total(self) -> int:
        return self.dense + self.experts + self.engram


def weight_bytes(spec: ModuleType, ranks: int | None = None,
                 engram_placement: str = DEFAULT_PLACEMENT) -> WeightBytes:
    """What one rank holds once the spec's checkpoint is loaded, on the spec's ranks or
    on `ranks` (the routed experts and, placed on the device, the Engram tables split
    over them)."""
    c = spec.contract
    args = ModelArgs.from_config(spec.architecture.CONFIG)
    held = c.WEIGHTS_FORMAT == "as_released"
    fp8, block = held and c.WEIGHTS_DENSE == "fp8", fp8_block(args)
    dense = experts = 0
    for name, shape in expected_shapes(args).items():
        if is_engram_table(name):             # placed apart: EngramTables
            continue
        if is_routed_expert(name):
            experts += _expert_bytes(shape, held and c.WEIGHTS_EXPERTS == "fp4", c.DTYPE)
        else:
            quantized = fp8 and _is_fp8(args, name, shape)
            dense += _dense_bytes(name, shape, quantized, c.DTYPE, block)
    ranks = ranks or c.EP
    engram = EngramTables.of(spec).device_bytes(engram_placement, ranks)
    return WeightBytes(dense, experts // ranks, engram)


def _is_fp8(args: ModelArgs, name: str, shape: tuple[int, ...]) -> bool:
    """A matrix an FP8 release of this family stores, and the device holds, in FP8."""
    return is_v41_fp8_projection(name) if args.is_v41 else is_fp8_projection(name, shape)


def _dense_bytes(name: str, shape: tuple[int, ...], fp8: bool, dtype: str, block: int) -> int:
    n = _numel(shape)
    if fp8:                                   # e4m3 bytes and one e8m0 byte per block
        return n + -(-shape[0] // block) * -(-shape[1] // block)
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
    """Temporaries of the largest launch at the context bucket of max_model_len, estimated
    from the shapes as the compiled graphs compute them. tests/runtime/test_workspace.py
    holds it between the peak the rehearsal measures (runtime/device/rehearsal.py) and 1.25
    times it, for every shipped spec.

    A main prefill walks its extent a tile at a time: a step carries P = N x S rows (N =
    slots, S = tile); a decode launch N x S = batch x seq. A layer's temporaries peak in one
    of its phases, on top of what the layer keeps throughout:

        kept       the mHC streams, q and its float32 copies      P (2 hc dim + 3 H D) 4
        attention  the logits over the window and the entries    2 P H (window + M) 4
                   a query reads (M: CSA index_topk; HCA every
                   entry of the bucket, bucket / 128), in parts
                   and concatenated (then masked and normalized
                   in place); a prefill tile's in bands of B =    2 N B H (window + B + M) 4
                   ATTENTION_BAND rows, with the bands' outputs   + P H D dtype_bytes
                   so far; those entries, read and in float32     CSA P topk D (pool + 4)
                                                                  HCA N E128 D (pool + 4)
        indexer    prefill: scores over every CSA entry (E4 =     2 P E4 4
                   bucket / 4), a head at a time, and each row's  N E4 index_dim (pool + 4)
                   index keys, read and in float32;
                   decode: a tile of entries at a time (T =       P (heads E4 / T + 2 E4) 4
                   INDEXER_TILES) over every head, and the        N E4 / T index_dim
                   tile's index keys                              (pool + 4)
        moe        a third of the rank's routed experts (w1, w3,  experts_per_rank inter
                   w2: one at a time) dequantized from FP4, with  dim dtype_bytes
                   the int32 codes and values of STACK_CHUNK      + chunk inter dim
                   experts;                                       (2 + dtype_bytes)
                   the rows of every rank (a rank may receive     ranks P (dim + k (dim
                   them all), each once per expert it chose       + 5 inter)) dtype_bytes
        logits     a step's decode rows (its launches are sampled 2 rows V 4
                   in one call) x vocabulary

    V4.1 (CSA2; no compiled graphs yet, so the rehearsal does not check these terms: they
    follow V4's compiled forms where V4.1 computes the same thing). A kv source of ratio
    r has E = bucket / r entries (ratio 1: one per token, 4 times V4's CSA):

        attention  as CSA's, over the window and index_topk entries of the kv source
        indexer    each index source's, as V4's over E (prefill: a head at a time;
                   decode: in tiles) and, at the candidate source,   + P E 4
                   a padded copy of the scores and the block         + P E/B 5
                   maxima and kept blocks (B = candidate_block_size);
                   above it, the kept blocks per entry and the       + P E 5
                   masked scores
        kept       + the kept blocks, passed up the layers           + P E/B
        engram     an Engram layer's lookups before its block: G =   P G (8 + row
                   (max_ngram - 1) x heads rows a token (int64 ids,    + head_dim 4)
                   the rows as held, in float32) and its hc keys and  + P (hc + 1) dim 4
                   value; the same in either placement (a step gathers its rows onto
                   the device from the rank's shard or the host's copy)

    workspace = max(kept + max(attention, indexer, moe) over launches, logits). Lower
    --max-model-len to a smaller bucket to shrink the attention and indexer phases."""
    c, cfg = spec.contract, spec.architecture.CONFIG
    a = ModelArgs.from_config(cfg)
    bucket = min((b for b in c.CONTEXT_BUCKETS if b >= limits.max_model_len),
                 default=c.CONTEXT_BUCKETS[-1])
    width = DTYPE_BYTES[c.DTYPE]
    experts = 0
    if c.WEIGHTS_FORMAT == "as_released" and c.WEIGHTS_EXPERTS == "fp4":
        held = a.n_experts // (ranks or c.EP)
        experts = (held * width + min(held, STACK_CHUNK) * (2 + width)) * a.moe_inter * a.dim
    shape = _Shape(a, cfg["sliding_window"], bucket, width, ranks or c.EP, experts,
                   EngramTables.of(spec).row_bytes)
    layers = max([shape.layer(c.SLOTS_PER_RANK, c.TILE, decode=False)]
                 + [shape.layer(lay.batch, lay.seq, decode=True)
                    for lay in c.DECODE_LAYOUTS.values()])
    rows = max(max(lay.batch * lay.seq for lay in c.DECODE_LAYOUTS.values())
               * c.DECODE_MICRO_BATCHES, c.SLOTS_PER_RANK)
    return max(layers, 2 * rows * a.vocab_size * 4)


@dataclass(frozen=True)
class _Shape:
    """The per-layer terms of `workspace` at one context bucket."""

    a: ModelArgs
    window: int
    bucket: int
    width: int              # bytes of a pool entry's value (the compute dtype)
    ranks: int              # of expert parallelism
    experts: int            # the dequantized third of the experts, with its temporaries
    engram_row: int = 0     # bytes of an Engram table row as held (V4.1)

    def layer(self, n: int, s: int, decode: bool) -> int:
        """The peak of one layer of a call of n rows of s tokens."""
        a, p, read = self.a, n * s, self.width + 4
        kinds = {a.kind(layer) for layer in range(a.n_layers)}
        kept = p * (2 * a.hc_mult * a.dim + 3 * a.n_heads * a.head_dim) * 4
        moe = self.ranks * p * (a.dim + a.n_active * (a.dim + 5 * a.moe_inter)) * self.width
        phases = [self._logits(n, s, 0), self.experts + moe]
        if "csa" in kinds:
            phases += [self._logits(n, s, a.index_topk) + p * a.index_topk * a.head_dim * read,
                       self._indexer(n, s, self.bucket // 4, decode)]
        if "hca" in kinds:
            e128 = self.bucket // 128
            phases.append(self._logits(n, s, e128) + n * e128 * a.head_dim * read)
        if "csa2" in kinds:
            kept += p * self._kept_blocks()
            phases += self._csa2(n, s, decode)
        if a.engram_layers:
            phases.append(self._engram(p))
        return kept + max(phases)

    def _indexer(self, n: int, s: int, entries: int, decode: bool) -> int:
        """Scores over `entries` index keys and the keys read (prefill: a head at a
        time; decode: INDEXER_TILES tiles of entries over every head)."""
        a, p, read = self.a, n * s, self.width + 4
        tile = entries // INDEXER_TILES if decode else entries
        scores = p * (a.index_heads * tile + 2 * entries) if decode else 2 * p * entries
        return scores * 4 + n * tile * a.index_head_dim * read

    def _csa2(self, n: int, s: int, decode: bool) -> list[int]:
        """V4.1's compressed layers: the attention over index_topk entries, and each
        index source's indexer over its kv source's entries (with the candidate blocks'
        terms at and above the candidate source)."""
        a, p, read = self.a, n * s, self.width + 4
        phases = [self._logits(n, s, a.index_topk) + p * a.index_topk * a.head_dim * read]
        for layer in a.index_source_layers:
            e = self.bucket // a.ratio(a.kv_source(layer))
            phase = self._indexer(n, s, e, decode)
            if layer == a.candidate_source_layer:
                phase += p * e * 4 + p * -(-e // a.candidate_block_size) * 5
            elif a.candidate_restricted(layer):
                phase += p * e * 5
            phases.append(phase)
        return phases

    def _kept_blocks(self) -> int:
        """Bytes per row of the candidate source's kept blocks (bool), 0 without one."""
        a = self.a
        if a.candidate_source_layer < 0:
            return 0
        e = self.bucket // a.ratio(a.candidate_source_layer)
        return -(-e // a.candidate_block_size)

    def _engram(self, p: int) -> int:
        """An Engram layer's lookups for p rows: ids, rows as held and in float32, and
        its hc keys and value in float32."""
        a = self.a
        rows = (a.engram_max_ngram - 1) * a.engram_heads
        return p * rows * (8 + self.engram_row + a.engram_head_dim * 4) \
            + p * (a.hc_mult + 1) * a.dim * 4

    def _logits(self, n: int, s: int, entries: int) -> int:
        """The attention logits of n rows of s queries over the window and `entries`;
        rows longer than a band attend a band at a time (window - 1 + band keys), with
        the bands' outputs so far."""
        a = self.a
        if s <= ATTENTION_BAND:
            return 2 * n * s * a.n_heads * (self.window + entries) * 4
        band = 2 * n * ATTENTION_BAND * a.n_heads * (self.window + ATTENTION_BAND + entries) * 4
        return band + n * s * a.n_heads * a.head_dim * self.width


@dataclass(frozen=True)
class MemoryPlan:
    device_memory: int          # bytes of one rank's device
    utilization: float          # the share of it v4serve may use
    weights: WeightBytes
    workspace: int
    ranks: int                  # of the replica: the routed experts split over them
    engram_placement: str = DEFAULT_PLACEMENT   # V4.1's tables: "device" | "host"

    @classmethod
    def of(cls, spec: ModuleType, device_memory: int, utilization: float, limits: Any,
           ranks: int | None = None,
           engram_placement: str = DEFAULT_PLACEMENT) -> MemoryPlan:
        experts = spec.architecture.CONFIG["n_routed_experts"]
        ranks = spec.contract.RANKS if ranks is None else ranks
        if ranks < 1 or experts % ranks:
            raise ValueError(f"{ranks} ranks: the {experts} routed experts must split evenly")
        if not 0 < utilization <= 1:
            raise ValueError(f"gpu_memory_utilization {utilization}: must be in (0, 1]")
        return cls(device_memory, utilization, weight_bytes(spec, ranks, engram_placement),
                   workspace(spec, limits, ranks), ranks, engram_placement)

    def placed(self, tables: EngramTables, placement: str) -> MemoryPlan:
        """This plan with the Engram tables in `placement` (the rest unchanged)."""
        engram = tables.device_bytes(placement, self.ranks)
        return replace(self, weights=replace(self.weights, engram=engram),
                       engram_placement=placement)

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

