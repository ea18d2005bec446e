"""The model runner: scheduler output -> launches of the generated kernels -> sampled tokens.

It owns the device side: the pools, the MTP slots, the sampling state, one launcher per
kernel (staging buffers allocated once) and the dispatch counters. A step:

    save      prefix caching: ring pages copied into cache pages (before any clear)
    clear     pages and slots handed to new owners are zeroed (targeted writes); then
              cached ring pages copied into the rings of requests that hit them
    decode    every decode launch; then all their rows sampled (MTP drafts verified)
              on the device in one call, and the MTP slots of the fused ones advanced
              in one update
    prefill   the main prefill, the first token of each finished prompt sampled on the
              device, the MTP prefill (its last next-token filled in on the device),
              the slots of finished prompts set; split at the block boundaries whose
              ring state is saved, each saved as the computation stands there
    copy      every sampled token, acceptance and log-prob to the host, at once

Per request, the host's share of the work can fail alone (its sampling row); a row
whose distribution comes out unsound (no finite mass) fails its request too. A launch
that raises (its marshalling, its kernel, its rows' sampling) fails the requests it
carries, with its error, and the step goes on without them: their pages and slots are
handed to the next owners zeroed, and their saves make no prefix-cache entry.

The runner orchestrates; each job has a module of its own:

    launch_inputs   tokens, positions, slots of each launch (host arrays), its block
                    tables (gathered from block_tables: per request slot, on the
                    device, updated with the blocks each step adds) and live rows
    sampler         sampling rows and the batch sampler's calls (sampling_state holds
                    the requests' parameters by slot, and their state on the device)
    grammar_masks   structured outputs: grammars compiled off the step, token masks
    mtp_slot_state  the MTP slots' tails and streams on the device
    page_copies     pages zeroed for new owners, the prefix cache's page copies
    step_result     the step's one copy to the host: each request's StepResult
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from runtime.core.request import Request
from runtime.core.scheduler import PrefillChunk, SchedulerOutput
from runtime.core.speculation import step_ks
from runtime.device import page_copies
from runtime.device.decode_step import DecodeStep
from runtime.device.grammar_masks import GrammarMasks
from runtime.device.launch_inputs import (
    LaunchInputs,
    chunk_rows,
    prefill_extents,
)
from runtime.device.launcher import Launcher
from runtime.device.mtp_slot_state import MtpSlotState
from runtime.device.pools import allocate_mtp_state, allocate_pools
from runtime.device.sampler import Sampler
from runtime.device.step_result import (
    Decoded,
    Sampled,
    StepResult,
    Timing,
    to_host,
)
from runtime.model.params import ModelParams
from runtime.text.grammar import StructuredOutputs
from runtime.weights.loader import bytes_per_rank, resident_bytes

if TYPE_CHECKING:
    from runtime.backends.compiled.graphs import Graphs


class ModelRunner:
    """The device side of `ranks` ranks: every rank of the replica in one process, or one
    rank in a rank worker (runtime/executor/rank_worker.py), whose steps arrive with requests'
    ranks made local (0) and which takes part in every launch of a step, with rows or
    without (its MoE collectives pair with the other ranks'). An Executor
    (runtime/executor/executor.py) of one process.

    `checkpoint`: its tokenizer serves structured outputs; `defer_compile`: graphs not
    compiled yet run eagerly meanwhile (the backend's `defer`); `adaptive`: each step
    brings its K (SchedulerOutput.k, 0..k) and launches that K's kernel; at K=0 the
    plain one, which leaves the MTP slots behind (caught up from the host by the next
    step that keeps them), or with `keep_slots` its twin (DECODE_KEEPING_SLOTS_BY_K),
    which moves the MTP layer's window and each slot's tail and streams on as a fused
    step does: a switch never recomputes."""

    def __init__(self, spec: ModuleType, params: ModelParams, blocks: dict[str, int], k: int,
                 backend: str, device: torch.device, ranks: int | None = None, *,
                 max_logprobs: int = 20, checkpoint: Path | None = None,
                 defer_compile: bool = False, adaptive: bool = False):
        self.spec, self.params, self.k, self.device = spec, params, k, device
        self.ranks = ranks or spec.contract.RANKS
        self.pools = allocate_pools(spec, blocks, device, ranks=self.ranks)
        self.mtp = allocate_mtp_state(spec, device, ranks=self.ranks) if k else None
        self.prefill = Launcher(spec.kernels.PREFILL_MAIN, device, backend, ranks=self.ranks)
        self.prefill_mtp = Launcher(spec.kernels.PREFILL_MTP, device, backend, ranks=self.ranks) \
            if k else None
        # every K a step may run: adaptive's; fixed K's, and the fewer drafts of the
        # last tokens before max_model_len (Scheduler._width)
        self.decoders = {j: Launcher(spec.kernels.DECODE_BY_K[j], device, backend,
                                     ranks=self.ranks)
                         for j in step_ks("adaptive" if adaptive else "fixed", k,
                                          spec.contract.DECODE_LAYOUTS)}
        # K=0 that keeps the MTP slots (adaptive): the twin
        self.twin = Launcher(spec.kernels.DECODE_KEEPING_SLOTS_BY_K[0], device, backend,
                             ranks=self.ranks) if adaptive and k else None
        self.backend = self.prefill.backend       # every launcher's: one per name
        if defer_compile:
            self.backend.defer = True
        self.max_logprobs = max_logprobs
        self.dispatches: Counter[str] = Counter()
        self.timing = Timing()
        self.inputs = LaunchInputs(spec, self.ranks, device)
        self.masks = GrammarMasks(checkpoint, spec.architecture.CONFIG, device)
        self.sampler = Sampler(self.ranks, spec.pools.REQUEST_SLOTS_PER_RANK + 1,
                               params.args.vocab_size, device, self.masks, self.timing)
        self.mtp_slots = MtpSlotState(self.mtp, spec.pools.MtpField, spec.contract.MTP_WINDOW,
                                  device) if k else None
        self._lagging: set[str] = set()      # requests whose slot a plain step left behind

    # -- the step --------------------------------------------------------------------

    def execute(self, out: SchedulerOutput,
                extents: list[int] | None = None) -> dict[Request, StepResult]:
        """One step. `extents`: those of the main prefill launches over every rank (a
        rank worker's own chunks may be fewer, or none)."""
        page_copies.copy_pages(self.pools, [c for save in out.saves for c in save.copies],
                               self.device)
        self._clear(out)
        self.inputs.update(out)
        page_copies.copy_pages(self.pools, out.restores, self.device)
        results: dict[Request, StepResult] = {}      # until to_host: the failed ones
        sampled = self._decode_step(out, results)
        launches = out.prefill_launches()
        if extents is None:
            extents = prefill_extents(self.spec.contract, launches)
        for i, extent in enumerate(extents):
            pieces = [p for p in (launches[i] if i < len(launches) else [])
                      if p.request not in results]        # a piece before it failed
            sampled += _isolated([p.request for p in pieces], results, [], self._prefill,
                                 pieces, results, extent)
            page_copies.copy_pages(self.pools, page_copies.saved_at(
                out.snapshots, [p for p in pieces if p.request not in results]), self.device)
        results.update(to_host(sampled, self.max_logprobs))
        return results

    def _decode_step(self, out: SchedulerOutput, results) -> list[Sampled]:
        """Every decode launch of the step, then their rows sampled at once; a launch
        that raises fails its own requests, a layout or a sampling that raises the
        step's decode rows."""
        rows = [r for launch in out.decode for r in launch]
        decoder = self._decoder(out)
        step = _isolated(rows, results, None, self.inputs.decode_step, out.decode,
                         decoder.kernel)
        if step is None:
            return []
        decoded = [_isolated(step.requests_of(i), results, None, self._decode, decoder, step,
                             i, results) for i in range(len(step))]
        sampled = [d.requests for d in decoded if d is not None]
        return _isolated([r for part in sampled for r in part], results, [],
                         self._sample_decoded, decoded, decoder.kernel, results)

    def _decoder(self, out: SchedulerOutput) -> Launcher:
        k = self.k if out.k is None else out.k
        return self.twin if not k and out.keep_slots and self.twin else self.decoders[k]

    def forget(self, request_id: str) -> None:
        self._lagging.discard(request_id)
        self.sampler.forget(request_id)
        self.masks.forget(request_id)

    def _clear(self, out: SchedulerOutput) -> None:
        """Targeted writes: a page or slot handed to a new owner starts zeroed."""
        page_copies.clear_pages(self.pools, out.fresh_blocks, self.device)
        for request in out.fresh_slots:
            if self.mtp_slots is not None:
                self.mtp_slots.clear(request)
            self.sampler.admit(request)

    def _launch(self, launcher: Launcher, patch=None, **kwargs):
        """Marshal, let `patch` edit the staged arguments (on the device), run; timed."""
        t0 = time.perf_counter()
        args = launcher.marshal(**kwargs)
        if patch is not None:
            patch(args)
        t1 = time.perf_counter()
        result = launcher.run(args)
        t2 = time.perf_counter()
        self.timing.marshal += t1 - t0
        self.timing.kernel += t2 - t1
        self.dispatches[launcher.kernel.name] += 1
        return result

    # -- warmup ----------------------------------------------------------------------

    def compiles(self) -> bool:
        """Whether this runner's launches run compiled graphs (see warmup)."""
        return self.backend.compiles(self.device)

    def warmup(self) -> None:
        """Run every kernel once with one row and with two (a row count of one is a
        graph of its own), on rows whose block tables are all -1: they read zeros and
        write only scratch pages, so no request's state is touched. A compiling
        backend compiles (or loads from its cache) every graph here."""
        held = dict(pools=self.pools, weights=self.params)
        for live in (1, 2):
            out = self.prefill.launch(**self.inputs.warm_prefill(live), **held)
            if self.k:
                self.prefill_mtp.launch(mtp_hidden=out.mtp_hidden,
                                        **self.inputs.warm_prefill_mtp(live), **held)
            for decoder in [*self.decoders.values(), *([self.twin] if self.twin else [])]:
                kernel = decoder.kernel
                drafts = dict(draft_mask=self.masks.draft_mask(self.inputs.decode_shape(kernel)),
                              mtp=self.mtp) if kernel.kind == "decode_mtp" else {}
                decoder.launch(**self.inputs.warm_decode(live, kernel), **drafts, **held)

    def graphs(self) -> Graphs | None:
        """The backend's graphs if they compile (None: an eager backend, or no launch
        yet)."""
        graphs = self.backend.graphs
        return graphs if graphs is not None and graphs.compiling else None

    def pending_graphs(self) -> int:
        graphs = self.graphs()
        return graphs.pending() if graphs is not None else 0

    # -- what it holds ---------------------------------------------------------------

    def rank_processes(self) -> list[dict]:
        return [{"ranks": self.ranks, "pid": os.getpid()}]

    def param_bytes_per_rank(self) -> int:
        return bytes_per_rank(self.params)

    def resident(self) -> dict[str, int]:
        """Device bytes held here: the weights and every rank's pools (and MTP slots)."""
        held = [self.pools] + ([self.mtp] if self.mtp else [])
        pools = [getattr(h, f.name) for h in held for f in dataclasses.fields(h)]
        return {"resident_weight_bytes": resident_bytes(self.params),
                "resident_pool_bytes": sum(t.numel() * t.element_size() for t in pools)}

    # -- decode ----------------------------------------------------------------------

    def _decode(self, decoder: Launcher, step: DecodeStep, i: int,
                results) -> Decoded | None:
        """Launch i of the step; its rows' outputs copied out for the step's sampling."""
        requests = step.requests_of(i)
        common = dict(pools=self.pools, weights=self.params,
                      **step.common(i, decoder.buffers))
        if decoder.kernel.kind == "decode_mtp":
            return self._decode_mtp(decoder, step, i, requests, common, results)
        out = self._launch(decoder, **step.tokens(i), **common)
        if not requests:
            return None
        return Decoded(requests, out.logits.view(-1, out.logits.shape[-1])[step.outputs(i)])

    def _decode_mtp(self, decoder: Launcher, step: DecodeStep, i: int,
                    requests: list[Request], common: dict, results) -> Decoded | None:
        """The fused MTP decode: draft under each usable row's grammar mask; the step
        verifies."""
        ok = self.sampler.usable(requests, results)
        kept = requests if len(ok) == len(requests) else [requests[j] for j in ok]
        if self._lagging:
            self._catch_up(kept)
        tail_masks = self.masks.masks(kept)
        constrained = [] if tail_masks is None else list(zip(kept, step.rows(i, ok)))
        draft_mask = self.masks.draft_mask(self.inputs.decode_shape(decoder.kernel),
                                           constrained, tail_masks)
        out = self._launch(decoder, draft_mask=draft_mask, mtp=self.mtp,
                           **step.slots(i), **common)
        if not kept:
            return None
        flat = step.outputs(i, ok)
        return Decoded(kept, out.logits.view(-1, *out.logits.shape[2:])[flat],     # copies
                       out.draft_ids.flatten(0, 1)[flat],
                       tail_masks, out.hidden.view(-1, *out.hidden.shape[2:])[flat])

    def _catch_up(self, requests: list[Request]) -> None:
        """Slots that plain steps left behind take their request's tail and position from
        the host (MtpSlotState.catch_up)."""
        behind = [r for r in requests if r.request_id in self._lagging]
        if behind:
            self.mtp_slots.catch_up(behind)
            self._lagging.difference_update(r.request_id for r in behind)

    def _sample_decoded(self, decoded: list[Decoded | None], kernel,
                        results) -> list[Sampled]:
        """Every decode launch's rows sampled in one call; fused, verified in one call
        and their MTP slots advanced in one update (a request is in one launch a step,
        and its slot is read again only by the next step)."""
        parts = [d for d in decoded if d is not None]
        if not parts:
            return []
        step = Decoded.joined(parts)
        if kernel.kind != "decode_mtp":
            if self.mtp_slots is not None:      # adaptive, a plain K=0 step: they lag
                self._lagging.update(r.request_id for r in step.requests)
            return self.sampler.sample(step.requests, step.logits, results)
        sampled, accepted = self.sampler.verify(step.requests, step.logits, step.draft,
                                                step.tail_masks, kernel.k)
        self.mtp_slots.advance(step.requests, sampled.tokens, accepted, step.hidden)
        return [sampled]

    # -- prefill ---------------------------------------------------------------------

    def _prefill(self, chunks: list[PrefillChunk], results, extent: int) -> list[Sampled]:
        """One main prefill launch, its first tokens sampled, and the MTP prefill."""
        out = self._launch(self.prefill, pools=self.pools, weights=self.params,
                           **self.inputs.prefill(chunks, extent, self.prefill.buffers))
        sampled, first = self._sample_first(chunks, out.logits, results)
        if self.k:
            self._prefill_mtp(chunks, out.mtp_hidden, sampled[0].tokens if first else None,
                              first, results)
        return sampled

    def _sample_first(self, chunks: list[PrefillChunk], logits: torch.Tensor,
                      results) -> tuple[list[Sampled], dict[Request, int]]:
        """The first token of each fresh prompt whose prefill ends here, from logits
        [ranks, slots, V]; `first` maps each request sampled to its row."""
        fresh = [ch for ch in chunks if ch.terminal and not ch.request.output_ids]
        if not fresh:
            return [], {}
        flat = self.inputs.flat_rows(chunk_rows(fresh), self.spec.contract.SLOTS_PER_RANK)
        sampled = self.sampler.sample([ch.request for ch in fresh],
                                      logits.view(-1, logits.shape[-1])[flat], results)
        return sampled, {r: i for i, r in enumerate(sampled[0].requests)} if sampled else {}

    def _prefill_mtp(self, chunks: list[PrefillChunk], hidden: torch.Tensor,
                     first_tokens: torch.Tensor | None, first: dict[Request, int],
                     results) -> None:
        """Rebuild the MTP layer's window from the chunks' last rows; a terminal chunk
        then fills its request's slot for the first fused decode. A fresh prompt's next
        token at its last row is its first sampled token, still on the device."""
        chunks = [ch for ch in chunks if ch.request not in results]       # not failed
        fill = [ch for ch in chunks if ch.request in first]
        self._launch(self.prefill_mtp,
                     patch=self.inputs.first_tokens_patch(fill, first, first_tokens),
                     mtp_hidden=hidden, pools=self.pools, weights=self.params,
                     **self.inputs.prefill_mtp(chunks, self.prefill_mtp.buffers))
        terminal = [ch for ch in chunks if ch.terminal]
        if terminal:
            self.mtp_slots.fill(terminal, hidden, first_tokens, first)

    # -- structured outputs ----------------------------------------------------------

    def prepare(self, constraint: StructuredOutputs) -> Future:
        """Compile a request's grammar off the step (see GrammarMasks.prepare)."""
        return self.masks.prepare(constraint)

    def adopt(self, request: Request, prepared) -> None:
        self.masks.adopt(request, prepared)

    def close(self) -> None:
        """Stop the grammar thread (compiles not started are dropped)."""
        self.masks.close()


def _isolated(requests: list[Request], results, failed, work, *args):
    """work(*args); if it raises, each of `requests` not failed already fails with the
    error (its StepResult) and `failed` is returned: the step goes on without them."""
    try:
        return work(*args)
    except Exception as exc:  # noqa: BLE001 - isolated to the launch's requests
        for request in requests:
            results.setdefault(request, StepResult([], error=exc))
        return failed
