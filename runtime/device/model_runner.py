"""The model runner: scheduler output -> generated wrapper launches -> sampled tokens.

It owns the device side: the pools, the MTP slots, the sampling state, one wrapper per
kernel (staging buffers allocated once) and the dispatch counters. A step:

    save      prefix caching: ring pages copied into cache pages (before any clear)
    clear     pages and slots handed to new owners are zeroed (targeted writes); then
              cached ring pages copied into the rings of requests that hit them
    decode    every decode launch, its rows sampled (MTP drafts verified, slots
              advanced) on the device
    prefill   the main prefill, the first token of each finished prompt sampled on the
              device, the MTP prefill (its last next-token filled in on the device),
              the slots of finished prompts set; split at the block boundaries whose
              ring state is saved, each saved as the computation stands there
    copy      every sampled token, acceptance and log-prob to the host, at once

Per request, only the host's share of the work can fail alone (its sampling row); a
row whose distribution comes out unsound (no finite mass) fails its request too.
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from runtime.core.request import Request
from runtime.core.scheduler import PageCopy, PrefillChunk, Save, SchedulerOutput
from runtime.device import batch_sampler
from runtime.device.sampling_state import SamplingState
from runtime.engine.grammar import GrammarError, StructuredOutputs, TokenMasks, Vocabulary
from runtime.engine.tokenizer import Tokenizer
from runtime.model.params import ModelParams


class SamplingFailure(RuntimeError):
    """A request's sampling distribution had no finite, positive mass."""


@dataclass
class TokenLogprobs:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class StepResult:
    """What one step produced for one request."""

    tokens: list[int]
    logprobs: list[TokenLogprobs] | None = None
    drafted: int = 0          # MTP draft tokens verified this step
    accepted: int = 0
    error: Exception | None = None    # this request's share of the step failed (no tokens)


@dataclass
class Timing:
    marshal: float = 0.0
    kernel: float = 0.0
    sample: float = 0.0


@dataclass
class _Sampled:
    """One launch's sampled rows, still on the device until the step's copy."""

    requests: list[Request]
    tokens: torch.Tensor          # [n, T] int64
    count: torch.Tensor           # [n] tokens each row commits
    sound: torch.Tensor           # [n] bool
    drafted: int = 0
    logits: torch.Tensor | None = None    # [n, T, V], kept only when log-probs are asked


class ModelRunner:
    """The device side of `ranks` ranks: every rank of the replica in one process, or one
    rank in a rank worker (runtime/executor/rank_worker.py), whose steps arrive with requests'
    ranks made local (0) and which takes part in every launch of a step, with rows or
    without (its MoE collectives pair with the other ranks')."""

    def __init__(self, spec: ModuleType, params: ModelParams, blocks: dict[str, int], k: int,
                 backend: str, device: torch.device, ranks: int | None = None):
        self.spec, self.params, self.k, self.device = spec, params, k, device
        self.ranks = ranks or spec.contract.RANKS
        self.every_launch = self.ranks < spec.contract.RANKS     # a rank worker
        self.pools = spec.pools.allocate(blocks, device, ranks=self.ranks)
        self.mtp = spec.pools.allocate_mtp_state(device, ranks=self.ranks) if k else None
        self.prefill = spec.kernels.PrefillMain(device, backend, ranks=self.ranks)
        self.prefill_mtp = spec.kernels.PrefillMtp(device, backend, ranks=self.ranks) \
            if k else None
        self.decode = spec.kernels.DECODE_BY_K[k](device, backend, ranks=self.ranks)
        self.states = spec.pools.REQUEST_SLOTS_PER_RANK + 1       # per rank, scratch last
        self.sampling = SamplingState(self.ranks * self.states, params.args.vocab_size, device)
        self.max_logprobs = 20
        self.dispatches: Counter[str] = Counter()
        self.timing = Timing()
        self._seeds: dict[str, int] = {}
        self._rng = random.Random()
        self.checkpoint: Path | None = None      # its tokenizer, for structured outputs
        self._masks: TokenMasks | None = None
        self._masks_lock = threading.Lock()
        self._compiler: ThreadPoolExecutor | None = None
        self._all_allowed: np.ndarray | None = None    # the unconstrained draft mask

    # -- the step --------------------------------------------------------------------

    def execute(self, out: SchedulerOutput,
                extents: list[int] | None = None) -> dict[Request, StepResult]:
        """One step. `extents`: those of the main prefill launches over every rank (a
        rank worker's own chunks may be fewer, or none)."""
        self._copy_pages([c for save in out.saves for c in save.copies])
        self._clear(out)
        self._copy_pages(out.restores)
        results: dict[Request, StepResult] = {}
        sampled: list[_Sampled] = []
        for launch in out.decode:
            sampled += self._decode(launch, results)
        launches = out.prefill_launches()
        if extents is None:
            extents = prefill_extents(self.spec.contract, launches)
        for i, extent in enumerate(extents):
            pieces = launches[i] if i < len(launches) else []
            sampled += self._prefill(pieces, results, extent)
            self._snapshot(out.snapshots, pieces)
        results.update(self._copy(sampled))
        return results

    def forget(self, request_id: str) -> None:
        self._seeds.pop(request_id, None)
        if self._masks is not None:
            self._masks.forget(request_id)

    def _copy_pages(self, copies: list[PageCopy]) -> None:
        """Page dst := page src in every layer of each copy's group; all the reads of a
        group come before its writes."""
        by_group: dict[str, list[PageCopy]] = {}
        for c in copies:
            by_group.setdefault(c.group, []).append(c)
        for group, cs in by_group.items():
            pool = getattr(self.pools, group)
            rank, src, dst = (torch.tensor(v, device=self.device)
                              for v in zip(*((c.rank, c.src, c.dst) for c in cs)))
            pool[rank, :, dst] = pool[rank, :, src]

    def _snapshot(self, snapshots: list[Save], pieces: list[PrefillChunk]) -> None:
        """The saves of boundaries where a piece of this launch ended."""
        ends = {(id(p.request), p.end) for p in pieces}
        self._copy_pages([c for s in snapshots if (id(s.request), s.boundary) in ends
                          for c in s.copies])

    def _clear(self, out: SchedulerOutput) -> None:
        """Targeted writes: a page or slot handed to a new owner starts zeroed."""
        for (rank, group), ids in out.fresh_blocks.items():
            getattr(self.pools, group)[rank, :, torch.tensor(ids, device=self.device)] = 0
        for request in out.fresh_slots:
            if self.mtp is not None:
                self.mtp.slots[request.rank, request.slot] = 0
                self.mtp.hidden[request.rank, request.slot] = 0
            self.sampling.admit(self._state(request), request.prompt_ids,
                                request.output_ids, request.params)

    def _state(self, request: Request) -> int:
        return request.rank * self.states + request.slot

    def _launch(self, wrapper, name: str, patch=None, **kwargs):
        t0 = time.perf_counter()
        args = wrapper.marshal(**kwargs)
        if patch is not None:
            patch(args)
        t1 = time.perf_counter()
        result = wrapper.run(args)
        t2 = time.perf_counter()
        self.timing.marshal += t1 - t0
        self.timing.kernel += t2 - t1
        self.dispatches[name] += 1
        return result

    def _tables(self, rows: list[tuple[int, int, Request]], width: int) -> dict[str, np.ndarray]:
        """Block tables [ranks, width, table_width] per group; -1 past each request's blocks."""
        ranks = self.ranks
        tables = {}
        for group, info in self.spec.pools.GROUPS.items():
            table = np.full((ranks, width, info.table_width), -1, np.int32)
            for rank, row, request in rows:
                ids = request.blocks[group]
                table[rank, row, : len(ids)] = ids
            tables[f"block_table_{group}"] = table
        return tables

    # -- warmup ----------------------------------------------------------------------

    def compiles(self) -> bool:
        """Whether this runner's launches run compiled graphs (see warmup)."""
        compiles = getattr(self.decode.backend, "compiles", None)
        return bool(compiles and compiles(self.device))

    def warmup(self) -> None:
        """Run every kernel once with one row and with two (a row count of one is a
        graph of its own), on rows whose block tables are all -1: they read zeros and
        write only scratch pages, so no request's state is touched. A compiling
        backend compiles (or loads from its cache) every graph here."""
        c = self.spec.contract
        shape = (self.ranks, c.SLOTS_PER_RANK)
        for live in (1, 2):
            lens = np.zeros(shape, np.int32)
            lens[0, :live] = c.TILE
            common = dict(pools=self.pools, weights=self.params, **self._tables([], shape[1]))
            out = self.prefill.launch(token_ids=np.zeros(shape + (c.TILE,), np.int64),
                                      start_pos=np.zeros(shape, np.int32), chunk_lens=lens,
                                      extent=c.TILE, **common)
            if self.k:
                self.prefill_mtp.launch(
                    mtp_hidden=out.mtp_hidden, next_ids=np.zeros(shape + (c.MTP_WINDOW,),
                                                                  np.int64),
                    start_pos=np.zeros(shape, np.int32), num_rows=lens,
                    block_table_ori=common["block_table_ori"], pools=self.pools,
                    weights=self.params)
            self._warm_decode(live)

    def _warm_decode(self, live: int) -> None:
        c = self.spec.contract
        batch = c.DECODE_LAYOUTS[self.k].batch
        shape = (self.ranks, batch)
        common = dict(pools=self.pools, weights=self.params, context=c.TILE,
                      **self._tables([], batch))
        if self.k:      # the scratch slot: generation 0, on scratch pages
            slots = np.full(shape, -1, np.int32)
            slots[0, :live] = self.spec.pools.REQUEST_SLOTS_PER_RANK
            self.decode.launch(slot_ids=slots, slot_gens=np.zeros(shape, np.int64),
                               draft_mask=self._free_drafts(shape), mtp=self.mtp, **common)
            return
        lens = np.zeros(shape, np.int32)
        lens[0, :live] = 1
        self.decode.launch(token_ids=np.zeros(shape + (1,), np.int64),
                           positions=np.zeros(shape, np.int32), row_lens=lens, **common)

    # -- decode ----------------------------------------------------------------------

    def _decode(self, launch: list[Request], results) -> list[_Sampled]:
        rows, per_rank = [], Counter()
        for request in launch:
            rows.append((request.rank, per_rank[request.rank], request))
            per_rank[request.rank] += 1
        batch = self.spec.contract.DECODE_LAYOUTS[self.k].batch
        # the last position a row reaches is its tail's + k (the drafts)
        context = max((request.num_tokens + self.k for request in launch),
                      default=self.spec.contract.TILE)
        common = dict(pools=self.pools, weights=self.params, context=context,
                      **self._tables(rows, batch))
        if self.k:
            return self._decode_mtp(rows, batch, common, results)
        shape = (self.ranks, batch)
        tokens, positions = np.zeros(shape + (1,), np.int64), np.zeros(shape, np.int32)
        lens = np.zeros(shape, np.int32)
        for rank, row, request in rows:
            tokens[rank, row, 0] = request.token_ids[-1]
            positions[rank, row], lens[rank, row] = request.num_tokens - 1, 1
        out = self._launch(self.decode, self.decode_name, token_ids=tokens, positions=positions,
                           row_lens=lens, **common)
        if not rows:
            return []
        logits = out.logits.view(-1, out.logits.shape[-1])[self._flat_rows(rows, batch)]
        return self._sample_rows([r for _, _, r in rows], logits, results)

    @property
    def decode_name(self) -> str:
        return self.spec.contract.DECODE_LAYOUTS[self.k].kernel

    def _flat_rows(self, rows, width: int) -> torch.Tensor:
        return torch.tensor([rank * width + row for rank, row, _ in rows], device=self.device)

    def _decode_mtp(self, rows, batch: int, common: dict, results) -> list[_Sampled]:
        shape = (self.ranks, batch)
        slot_ids, gens = np.full(shape, -1, np.int32), np.zeros(shape, np.int64)
        for rank, row, request in rows:
            slot_ids[rank, row], gens[rank, row] = request.slot, request.slot_generation
        requests, rows_params = self._params(rows, results)
        tail_masks = self._masks_of([r for r, _ in requests])
        draft_mask = self._free_drafts(shape)
        if tail_masks is not None:
            draft_mask = draft_mask.copy()        # the shared all-ones array stays as it is
            for (request, row), mask in zip(requests, tail_masks):
                draft_mask[request.rank, row] = mask
        out = self._launch(self.decode, self.decode_name, slot_ids=slot_ids, slot_gens=gens,
                           draft_mask=draft_mask, mtp=self.mtp, **common)
        if not requests:
            return []
        t0 = time.perf_counter()
        flat = self._flat_rows([(r.rank, row, r) for r, row in requests], batch)
        logits = out.logits.view(-1, *out.logits.shape[2:])[flat]            # [n, 2, V]
        draft = out.draft_ids.view(-1, out.draft_ids.shape[-1])[flat][:, 0]
        counts, seen = self.sampling.penalties(rows_params)
        allowed = self._allowed_after_draft([r for r, _ in requests], tail_masks, draft)
        tokens, kept, sound = batch_sampler.verify(logits, draft, rows_params, counts, seen,
                                                   allowed)
        self._advance_slots([r for r, _ in requests], tokens, kept,
                            out.hidden.view(-1, *out.hidden.shape[2:])[flat])
        count = 1 + kept.long()
        self.sampling.count(rows_params, tokens, count)
        self.timing.sample += time.perf_counter() - t0
        return [_Sampled([r for r, _ in requests], tokens, count, sound, self.k,
                         logits if self._logprobs_wanted(requests) else None)]

    def _advance_slots(self, requests: list[Request], tokens: torch.Tensor, kept: torch.Tensor,
                       hidden: torch.Tensor) -> None:
        """The slots' state after verification: the new tail (the bonus token if the
        draft was kept, else the target), its position, and the streams before it."""
        field = self.spec.pools.MtpField
        rank, slot = self._rank_slot(requests)
        state = self.mtp.slots[rank, slot]
        step = 1 + kept.long()
        tail_pos = state[:, field.TAIL_POS] + step
        state[:, field.TAIL_TOKEN] = tokens.gather(1, kept.long()[:, None])[:, 0]
        state[:, field.TAIL_POS], state[:, field.COMMITTED] = tail_pos, tail_pos + 1
        self.mtp.slots[rank, slot] = state
        self.mtp.hidden[rank, slot] = hidden[torch.arange(len(requests)), kept.long()]

    def _rank_slot(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = torch.tensor([(r.rank, r.slot) for r in requests], device=self.device)
        return pairs[:, 0], pairs[:, 1]

    # -- prefill ---------------------------------------------------------------------

    def _prefill(self, chunks: list[PrefillChunk], results, extent: int) -> list[_Sampled]:
        c = self.spec.contract
        shape = (self.ranks, c.SLOTS_PER_RANK)
        tokens = np.zeros(shape + (extent,), np.int64)
        starts, lens = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
        for ch in chunks:
            r = ch.request
            tokens[r.rank, ch.slot, : ch.length] = r.token_ids[ch.start:ch.end]
            starts[r.rank, ch.slot], lens[r.rank, ch.slot] = ch.start, ch.length
        rows = [(ch.request.rank, ch.slot, ch.request) for ch in chunks]
        out = self._launch(self.prefill, "prefill_main", token_ids=tokens, start_pos=starts,
                           chunk_lens=lens, extent=extent, pools=self.pools, weights=self.params,
                           **self._tables(rows, c.SLOTS_PER_RANK))
        fresh = [ch for ch in chunks if ch.terminal and not ch.request.output_ids]
        sampled, first = [], {}
        if fresh:
            flat = self._flat_rows([(ch.request.rank, ch.slot, None) for ch in fresh],
                                   c.SLOTS_PER_RANK)
            sampled = self._sample_rows([ch.request for ch in fresh], out.logits.view(
                -1, out.logits.shape[-1])[flat], results)
            if sampled:
                first = {r: i for i, r in enumerate(sampled[0].requests)}
        if self.k:
            self._prefill_mtp(chunks, out.mtp_hidden, sampled[0].tokens if first else None,
                              first, results)
        return sampled

    def _prefill_mtp(self, chunks: list[PrefillChunk], hidden: torch.Tensor,
                     first_tokens: torch.Tensor | None, first: dict[Request, int],
                     results) -> None:
        """Rebuild the MTP layer's window from the chunks' last rows; a terminal chunk
        then fills its request's slot for the first fused decode. A fresh prompt's next
        token at its last row is its first sampled token, still on the device."""
        c = self.spec.contract
        chunks = [ch for ch in chunks if ch.request not in results]       # not failed
        shape = (self.ranks, c.SLOTS_PER_RANK)
        next_ids = np.zeros(shape + (c.MTP_WINDOW,), np.int64)
        starts, nrows = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
        for ch in chunks:
            r, width = ch.request, min(c.MTP_WINDOW, ch.length)
            known = r.token_ids[ch.end - width + 1: ch.end + 1]   # the last may be unknown
            next_ids[r.rank, ch.slot, : len(known)] = known
            starts[r.rank, ch.slot], nrows[r.rank, ch.slot] = ch.end - width, width
        fill = [ch for ch in chunks if ch.request in first]

        def patch(args) -> None:
            if fill:
                at = torch.tensor([(ch.request.rank, ch.slot, min(c.MTP_WINDOW, ch.length) - 1)
                                   for ch in fill], device=self.device)
                pick = torch.tensor([first[ch.request] for ch in fill], device=self.device)
                args.next_ids[at[:, 0], at[:, 1], at[:, 2]] = first_tokens[pick, 0]

        rows = [(ch.request.rank, ch.slot, ch.request) for ch in chunks]
        tables = self._tables(rows, c.SLOTS_PER_RANK)
        self._launch(self.prefill_mtp, "prefill_mtp", patch=patch, mtp_hidden=hidden,
                     next_ids=next_ids, start_pos=starts, num_rows=nrows,
                     block_table_ori=tables["block_table_ori"], pools=self.pools,
                     weights=self.params)
        terminal = [ch for ch in chunks if ch.terminal]
        if terminal:
            self._fill_slots(terminal, hidden, first_tokens, first)

    def _fill_slots(self, chunks: list[PrefillChunk], hidden: torch.Tensor,
                    first_tokens: torch.Tensor | None, first: dict[Request, int]) -> None:
        """Slots of finished prefills: tail = the first sampled token (a fresh prompt)
        or the known tail (a resumed request), at position end, and the streams of the
        row before it."""
        c, field = self.spec.contract, self.spec.pools.MtpField
        requests = [ch.request for ch in chunks]
        rank, slot = self._rank_slot(requests)
        tail = torch.tensor([r.token_ids[-1] for r in requests], device=self.device)
        if first:
            fresh = torch.tensor([r in first for r in requests], device=self.device)
            pick = torch.tensor([first.get(r, 0) for r in requests], device=self.device)
            tail = torch.where(fresh, first_tokens[pick, 0], tail)
        end = torch.tensor([ch.end for ch in chunks], device=self.device)
        state = torch.stack((tail, end, end + 1,
                             torch.tensor([r.slot_generation for r in requests],
                                          device=self.device)), dim=1)
        columns = [field.TAIL_TOKEN, field.TAIL_POS, field.COMMITTED, field.GENERATION]
        self.mtp.slots[rank[:, None], slot[:, None],
                       torch.tensor(columns, device=self.device)] = state
        width = torch.tensor([min(c.MTP_WINDOW, ch.length) - 1 for ch in chunks],
                             device=self.device)
        home = torch.tensor([ch.slot for ch in chunks], device=self.device)
        self.mtp.hidden[rank, slot] = hidden[rank, home, width]

    # -- sampling --------------------------------------------------------------------

    def _params(self, rows, results) -> tuple[list[tuple[Request, int]], object]:
        """The rows' sampling parameters; a request whose own row cannot be built fails
        alone (its StepResult carries the error) and leaves the launch."""
        ok, values = [], []
        for _, row, request in rows:
            try:
                values.append(self._row(request))
            except Exception as exc:  # noqa: BLE001 - isolated to this request
                results[request] = StepResult([], error=exc)
                continue
            ok.append((request, row))
        if not ok:
            return [], None
        return ok, self.sampling.row_params(*(list(column) for column in zip(*values)))

    def _row(self, request: Request) -> tuple:
        """(params, seed, output index, state slot) of a request's sampling row."""
        if request.params.structured is not None:
            self._token_masks().mask(request)      # a grammar that fails, fails here
        return (request.params, self._seed(request), len(request.output_ids),
                self._state(request))

    def _seed(self, request: Request) -> int:
        """The request's stream (a signed 64-bit integer): its seed, or one drawn once
        for it."""
        if request.request_id not in self._seeds:
            seed = request.params.seed
            self._seeds[request.request_id] = seed if seed is not None \
                else self._rng.getrandbits(63)
        return self._seeds[request.request_id]

    def _sample_rows(self, requests: list[Request], logits: torch.Tensor,
                     results) -> list[_Sampled]:
        """One token per row of logits [n, V] (the rows of `requests`)."""
        t0 = time.perf_counter()
        ok, rows_params = self._params([(r.rank, i, r) for i, r in enumerate(requests)],
                                       results)
        if not ok:
            return []
        logits = logits[torch.tensor([i for _, i in ok], device=self.device)]
        counts, seen = self.sampling.penalties(rows_params)
        token, sound = batch_sampler.sample(logits, rows_params, counts, seen,
                                            self._allowed([r for r, _ in ok]))
        tokens = token[:, None]
        count = torch.ones_like(token)
        self.sampling.count(rows_params, tokens, count)
        self.timing.sample += time.perf_counter() - t0
        kept = [r for r, _ in ok]
        return [_Sampled(kept, tokens, count, sound, 0,
                         logits[:, None] if self._logprobs_wanted(ok) else None)]

    # -- structured outputs ----------------------------------------------------------

    def _token_masks(self) -> TokenMasks:
        with self._masks_lock:             # prepare() may build them on its thread
            if self._masks is None:
                self._masks = TokenMasks(self._vocabulary())
        return self._masks

    def prepare(self, constraint: StructuredOutputs) -> Future:
        """Compile a request's grammar (the first time, the grammar vocabulary too) on a
        thread of its own. The future's result is the request's matcher: the engine
        hands it back with `adopt` and schedules the request, so no step compiles."""
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(1, thread_name_prefix="v4serve-grammar")
        return self._compiler.submit(lambda: self._token_masks().vocabulary.matcher(constraint))

    def adopt(self, request: Request, prepared) -> None:
        """The matcher `prepare` compiled becomes the request's."""
        self._token_masks().adopt(request.request_id, prepared)

    def close(self) -> None:
        """Stop the grammar thread (compiles not started are dropped)."""
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)

    def _vocabulary(self) -> Vocabulary:
        path = self.checkpoint / "tokenizer.json" if self.checkpoint else None
        if path is None or not path.exists():
            raise GrammarError("structured outputs need the checkpoint's tokenizer.json")
        return Vocabulary.of(Tokenizer(self.checkpoint), self.spec.architecture.CONFIG)

    def _masks_of(self, requests: list[Request]) -> np.ndarray | None:
        """[n, ceil(V / 32)] int32: each row's grammar mask for its next token (None: no
        row is constrained)."""
        if all(r.params.structured is None for r in requests):
            return None
        return self._token_masks().masks(requests)

    def _free_drafts(self, shape: tuple[int, int]) -> np.ndarray:
        """A draft mask allowing every token to every row: one array, built once (a step
        without constrained rows passes it as is; callers must not write to it)."""
        if self._all_allowed is None or self._all_allowed.shape[:2] != shape:
            words = (self.spec.architecture.CONFIG["vocab_size"] + 31) // 32
            self._all_allowed = np.full((*shape, words), -1, np.int32)
        return self._all_allowed

    def _allowed(self, requests: list[Request]) -> torch.Tensor | None:
        """[n, V] bool: the tokens each row may take next (None: no row is constrained)."""
        masks = self._masks_of(requests)
        return None if masks is None else self._unpack(masks)

    def _allowed_after_draft(self, requests: list[Request], tail_masks: np.ndarray | None,
                             draft: torch.Tensor) -> torch.Tensor | None:
        """[n, 2, V] bool for fused MTP rows: the mask at the tail (the launch drafted
        under it too) and the mask after the draft. The drafts of constrained rows come to
        the host for it (one small copy, only in a step that has such a row)."""
        if tail_masks is None:
            return None
        later = self._token_masks().draft_masks(requests, draft.tolist(), tail_masks)
        return self._unpack(np.stack((tail_masks, later), axis=1))

    def _unpack(self, masks: np.ndarray) -> torch.Tensor:
        words = torch.from_numpy(masks).to(self.device)
        return batch_sampler.unpack_mask(words, self.spec.architecture.CONFIG["vocab_size"])

    def _logprobs_wanted(self, rows) -> bool:
        return any(r.params.logprobs is not None for r, _ in rows)

    # -- the step's one copy to the host ---------------------------------------------

    def _copy(self, sampled: list[_Sampled]) -> dict[Request, StepResult]:
        """Every launch's tokens, counts, soundness (and log-probs) in one transfer."""
        if not sampled:
            return {}
        parts = []
        for s in sampled:
            parts += [s.tokens.reshape(-1).double(), s.count.double(), s.sound.double()]
            if s.logits is not None:
                lp, ids, vals = batch_sampler.logprobs(s.logits, s.tokens, self.max_logprobs)
                parts += [lp.reshape(-1).double(), ids.reshape(-1).double(),
                          vals.reshape(-1).double()]
        host = torch.cat(parts).cpu().numpy()
        results, at = {}, 0
        for s in sampled:
            n, width = s.tokens.shape
            tokens = host[at: at + n * width].reshape(n, width).astype(np.int64)
            count = host[at + n * width: at + n * width + n].astype(np.int64)
            sound = host[at + n * width + n: at + n * width + 2 * n].astype(bool)
            at += n * width + 2 * n
            logprobs = None
            if s.logits is not None:
                top = batch_sampler.top_width(self.max_logprobs, s.logits.shape[-1])
                logprobs, at = _unpack_logprobs(host, at, n, width, top)
            for i, request in enumerate(s.requests):
                results[request] = self._result(request, tokens[i, : count[i]], sound[i],
                                                s.drafted, logprobs, i)
        return results

    def _result(self, request: Request, tokens: np.ndarray, sound: bool, drafted: int,
                logprobs, i: int) -> StepResult:
        if not sound:
            return StepResult([], error=SamplingFailure(
                "no token has a finite, positive probability under this request's "
                "sampling parameters"))
        tokens = tokens.tolist()
        lps = None
        if request.params.logprobs is not None:
            chosen, ids, vals = logprobs
            top = request.params.logprobs
            lps = [TokenLogprobs(t, float(chosen[i, j]),
                                 list(zip(ids[i, j, :top].tolist(), vals[i, j, :top].tolist())))
                   for j, t in enumerate(tokens)]
        return StepResult(tokens, lps, drafted=drafted, accepted=len(tokens) - 1 if drafted else 0)


def _unpack_logprobs(host: np.ndarray, at: int, n: int, width: int, top: int):
    size = n * width
    chosen = host[at: at + size].reshape(n, width)
    ids = host[at + size: at + size + size * top].reshape(n, width, top).astype(np.int64)
    vals = host[at + size + size * top: at + size + 2 * size * top].reshape(n, width, top)
    return (chosen, ids, vals), at + size + 2 * size * top


def prefill_extents(contract: ModuleType, launches: list[list[PrefillChunk]]) -> list[int]:
    """The extent of each main prefill launch: its longest piece padded to the tile."""
    return [max(contract.dispatch_extent(p.length) for p in launch) for launch in launches]
