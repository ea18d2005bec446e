"""A deployment rehearsed without its hardware: one rank of a spec's replica, at full
size, on fake tensors.

Under FakeTensorMode every tensor has its real shape, dtype and device and no storage,
so V4-Flash's or V4-Pro's weights (their release's dtypes, this rank's share of the
experts; runtime/weights/fake_checkpoint.py), pools sized for the deepest context and
every launch's staging buffers cost no memory. The ranks' collectives go to a fake
process group of the spec's world size (they return at once). Each launch the engine can
issue runs at its largest shapes, every row live, through the compiled backend's graphs
run as written (no compile), with the static-shape MoE of decode launches taking the
place of the operator's registered fake; a PeakTracker (runtime/device/peak_tracker.py)
measures each launch's peak: the workspace it allocates beyond the weights and pools.
A device-side error (an op refusing a dtype, a shape that does not fit, a host read of a
device value) fails the launch and names it.

The fake tensors stand on the device the deployment runs on (cuda or npu: runtime/device/
fake_device.py makes them on a CPU build of torch), so a tensor left on the host, or made
on the wrong device, fails its launch as it would on the hardware.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from contract.abi import EXTENT, RANKS, KernelABI
from runtime.backends.arg_checks import torch_dtype
from runtime.backends.compiled import expert_parallel, forward
from runtime.core.sampling_params import SamplingParams
from runtime.device.fake_device import fake_device
from runtime.device.launcher import Launcher
from runtime.device.peak_tracker import PeakTracker
from runtime.device.pools import allocate_mtp_state, allocate_pools
from runtime.sampling import batch_sampler
from runtime.sampling.sampling_state import row_params
from runtime.weights.fake_checkpoint import FakeCheckpoint
from runtime.weights.loader import load_params


@dataclass
class Rehearsed:
    """One launch of the rehearsal."""

    kernel: str
    context: int                 # positions the rows reach (0: does not apply)
    rows: int                    # tokens the launch carries on this rank
    peak_bytes: int | None       # MemTracker's peak during the launch (None: it failed)
    seconds: float
    error: str | None = None


class Rehearsal:
    """Rank `rank` of `spec`'s replica (of its ranks, or of `ranks`), every other rank a
    fake one."""

    def __init__(self, spec: ModuleType, rank: int = 0, k: int | None = None,
                 device: str = "cpu", ranks: int | None = None):
        self.ranks = ranks or spec.contract.RANKS
        if not getattr(spec, "REHEARSED", True):
            raise ValueError(f"spec {spec.SPEC_NAME}: its kernels run on the "
                             f"{spec.contract.BACKEND} backend only, and a rehearsal runs the "
                             "compiled backend's graphs")
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank}: the replica has ranks 0..{self.ranks - 1}")
        self.spec, self.rank, self.kind = spec, rank, device
        self.k = spec.contract.DEFAULT_NUM_SPECULATIVE_TOKENS if k is None else k
        self.mode = FakeTensorMode()
        self.deepest = spec.contract.CONTEXT_BUCKETS[-1]
        with fake_device(device) as self.device, self.mode:
            self.params = load_params(None, spec, self.device, held=range(rank, rank + 1),
                                      checkpoint=FakeCheckpoint(spec), ranks=self.ranks)
            # the compiled backend stacks each layer's projections into one tensor when it
            # first meets the weights (the originals become views of it): done here, so
            # that no launch counts that move of the weights as its workspace
            forward.layers(self.params, dict(spec.kernels.PREFILL_MAIN.groups))
            blocks = {g: group.table_width for g, group in spec.pools.GROUPS.items()}
            self.pools = allocate_pools(spec, blocks, self.device, ranks=1)
            self.mtp = allocate_mtp_state(spec, self.device, ranks=1) if self.k else None

    def launches(self, prefill_extent: int | None = None,
                 contexts: tuple[int, ...] | None = None) -> Iterator[Rehearsed]:
        """Every launch kind: each decode layout up to K at every context (default: the
        spec's buckets) and its sampler (with K > 0, the K=0 layout's twin that keeps
        the MTP slots too: an adaptive policy's plain steps), the main prefill of
        `prefill_extent` rows per slot (default: the spec's max extent) at the deepest
        context, and the MTP prefill."""
        c, kernels = self.spec.contract, self.spec.kernels
        keeping = getattr(kernels, "DECODE_KEEPING_SLOTS_BY_K", {}) if self.k else {}
        for k in sorted(c.DECODE_LAYOUTS):
            if k <= self.k:
                for kernel in (kernels.DECODE_BY_K[k], *([keeping[0]] if k == 0 and keeping
                                                         else [])):
                    for context in contexts or c.CONTEXT_BUCKETS:
                        yield self.run(kernel, context)
                yield self.sample(kernels.DECODE_BY_K[k])
        yield self.run(self.spec.kernels.PREFILL_MAIN, self.deepest,
                       prefill_extent or c.MAX_EXTENT)
        if self.k:
            yield self.run(self.spec.kernels.PREFILL_MTP, self.deepest)

    def run(self, kernel: KernelABI, context: int, extent: int | None = None) -> Rehearsed:
        """One launch of `kernel` with every row live, its rows reaching `context`."""
        with (_FakeGroup(self.ranks, self.rank), fake_device(self.kind),
              self.mode):
            launcher = Launcher(kernel, self.device, backend="compiled-eager", ranks=1)
            given = self._inputs(kernel, context, extent)
            rows = kernel.rows * (extent or kernel.seq or self.spec.contract.MTP_WINDOW)
            # what exists before the launch is known to the tracker, so that touching a
            # weight or a pool page inside it is not counted as an allocation
            tracker = PeakTracker(_tensors((self.params, self.pools, self.mtp,
                                            launcher.buffers, given)))
            start = time.perf_counter()
            try:
                with tracker, expert_parallel.fixed_rows():
                    launcher.launch(**given)
            except Exception as exc:  # noqa: BLE001 - reported, named by its launch
                return Rehearsed(kernel.name, context, rows, None,
                                 time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
            return Rehearsed(kernel.name, context, rows, tracker.peak,
                             time.perf_counter() - start)

    def sample(self, kernel: KernelABI) -> Rehearsed:
        """The device sampler over a step's decode logits (every decode launch a rank
        runs in a step: they are sampled in one call), every row with every feature
        (temperature, top-k, top-p, min-p, penalties, a logit bias, a grammar mask); with
        MTP (seq K + 1) the verification of each row's drafts."""
        rows = kernel.rows * self.spec.contract.DECODE_MICRO_BATCHES
        vocab = self.spec.architecture.CONFIG["vocab_size"]
        tokens = rows * kernel.seq
        name = "verify" if kernel.seq > 1 else "sample"
        with fake_device(self.kind), self.mode:
            params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05,
                                     presence_penalty=0.5, frequency_penalty=0.5,
                                     repetition_penalty=1.1)] * rows
            dev = self.device
            given = (torch.zeros(rows, kernel.seq, vocab, device=dev),
                     dataclasses.replace(
                         row_params(params, [7] * rows, [3] * rows, list(range(rows)), dev),
                         bias=torch.zeros(rows, vocab, device=dev)),
                     torch.zeros(rows, vocab, dtype=torch.int32, device=dev),
                     torch.zeros(rows, vocab, dtype=torch.bool, device=dev),
                     torch.ones(rows, kernel.seq, vocab, dtype=torch.bool, device=dev))
            tracker = PeakTracker(_tensors(given))
            start = time.perf_counter()
            try:
                with tracker:
                    _sample_or_verify(*given)
            except Exception as exc:  # noqa: BLE001 - reported, named by its launch
                return Rehearsed(name, 0, tokens, None, time.perf_counter() - start,
                                 f"{type(exc).__name__}: {exc}")
            return Rehearsed(name, 0, tokens, tracker.peak, time.perf_counter() - start)

    def _inputs(self, kernel: KernelABI, context: int, extent: int | None) -> dict:
        """Every keyword of the kernel's launch: rows reaching `context`, all live."""
        given = {"pools": self.pools, "weights": self.params}
        if self.mtp is not None:
            given["mtp"] = self.mtp
        for arg in kernel.args:
            if arg.role in ("input", "metadata", "scalar") and arg.name != "weights":
                given[arg.name] = self._value(arg, kernel, context, extent)
        return {key: value for key, value in given.items()
                if key in _keywords(kernel)}

    def _value(self, arg, kernel: KernelABI, context: int, extent: int | None):
        dims = {RANKS: 1, EXTENT: extent}
        shape = tuple(dims.get(d, d) for d in arg.shape)
        if not arg.staged and arg.role == "input":          # a device tensor passed in
            return torch.zeros(shape, dtype=torch_dtype(arg.dtype), device=self.device)
        tokens = extent or kernel.seq or self.spec.contract.MTP_WINDOW
        return _host_value(arg.name, shape, context, tokens, kernel.rows)


def _sample_or_verify(logits, rows, counts, seen, allowed) -> None:
    """batch_sampler.sample over logits [N, 1, V], or verify over [N, K + 1, V] (every
    draft: 1)."""
    if logits.shape[1] == 1:
        batch_sampler.sample(logits[:, 0], rows, counts, seen, allowed[:, 0])
    else:
        draft = torch.ones(logits.shape[:2], dtype=torch.long, device=logits.device)[:, 1:]
        batch_sampler.verify(logits, draft, rows, counts, seen, allowed)


def _host_value(name: str, shape: tuple, context: int, tokens: int, rows: int):
    """Host data of a staged argument (or a scalar) for rows of `tokens` tokens ending at
    `context`, every row live."""
    if name.startswith("block_table_"):
        return np.broadcast_to(np.arange(shape[-1], dtype=np.int32), shape).copy()
    values = {
        "token_ids": 1, "next_ids": 1, "slot_gens": 1, "draft_mask": -1,
        "positions": context - tokens, "start_pos": context - tokens,
        "row_lens": tokens, "chunk_lens": tokens, "num_rows": tokens,
    }
    if name == "slot_ids":
        return np.arange(rows, dtype=np.int32)[None]
    if name in ("context", "extent"):
        return context if name == "context" else tokens
    return np.full(shape, values[name], dtype=np.int64)     # staged as the buffer's dtype


def _tensors(value) -> list[torch.Tensor]:
    """Every tensor inside `value` (dataclasses, mappings, sequences of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        value = list(value.values())
    elif not isinstance(value, (list, tuple)):
        return []
    return [t for item in value for t in _tensors(item)]


def _keywords(kernel: KernelABI) -> set[str]:
    return {a.source.partition(".")[0] for a in kernel.args if a.role != "output"}


class _FakeGroup:
    """Expert parallelism over a fake process group of `ranks`, this process `rank`; the
    layers call the MoE's implementation (its registered fake would check nothing)."""

    def __init__(self, ranks: int, rank: int):
        self.ranks, self.rank = ranks, rank

    def __enter__(self) -> None:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=self.rank,
                                world_size=self.ranks)
        expert_parallel.enable(dist.group.WORLD)
        self.op, forward.ep_moe = forward.ep_moe, expert_parallel._ep_moe

    def __exit__(self, *exc: object) -> None:
        forward.ep_moe = self.op
        expert_parallel.enable(None)
        dist.destroy_process_group()
