"""The model runner: scheduler output -> generated wrapper launches -> sampled tokens.

It owns the device side: the pools, the MTP slot tensors, one wrapper per kernel
(staging buffers allocated once), the samplers' generators, and the dispatch counters.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from runtime import sampler
from runtime.model.params import ModelParams
from runtime.request import Request
from runtime.scheduler import PrefillChunk, SchedulerOutput


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


class ModelRunner:
    def __init__(self, spec: ModuleType, params: ModelParams, blocks: dict[str, int], k: int,
                 backend: str, device: torch.device):
        self.spec, self.params, self.k, self.device = spec, params, k, device
        self.pools = spec.pools.allocate(blocks, device)
        self.mtp = spec.pools.allocate_mtp_state(device) if k else None
        self.prefill = spec.kernels.PrefillMain(device, backend)
        self.prefill_mtp = spec.kernels.PrefillMtp(device, backend) if k else None
        self.decode = spec.kernels.DECODE_BY_K[k](device, backend)
        self.dispatches: Counter[str] = Counter()
        self.timing = Timing()
        self._generators: dict[str, torch.Generator] = {}

    # -- the step --------------------------------------------------------------------

    def execute(self, out: SchedulerOutput) -> dict[Request, StepResult]:
        self._clear(out)
        results: dict[Request, StepResult] = {}
        for launch in out.decode:
            results.update(self._decode(launch))
        if out.prefill:
            results.update(self._prefill(out.prefill))
        return results

    def forget(self, request: Request) -> None:
        self._generators.pop(request.request_id, None)

    def _clear(self, out: SchedulerOutput) -> None:
        """Targeted writes: a page or slot handed to a new owner starts zeroed."""
        for (rank, group), ids in out.fresh_blocks.items():
            getattr(self.pools, group)[rank, :, torch.tensor(ids, device=self.device)] = 0
        for rank, slot in out.fresh_slots if self.mtp else ():
            self.mtp.slots[rank, slot] = 0
            self.mtp.hidden[rank, slot] = 0

    def _launch(self, wrapper, name: str, **kwargs):
        t0 = time.perf_counter()
        args = wrapper.marshal(**kwargs)
        t1 = time.perf_counter()
        result = wrapper.run(args)
        t2 = time.perf_counter()
        self.timing.marshal += t1 - t0
        self.timing.kernel += t2 - t1
        self.dispatches[name] += 1
        return result

    def _tables(self, rows: list[tuple[int, int, Request]], width: int) -> dict[str, np.ndarray]:
        """Block tables [ranks, width, table_width] per group; -1 past each request's blocks."""
        ranks = self.spec.contract.RANKS
        tables = {}
        for group, info in self.spec.pools.GROUPS.items():
            table = np.full((ranks, width, info.table_width), -1, np.int32)
            for rank, row, request in rows:
                ids = request.blocks[group]
                table[rank, row, : len(ids)] = ids
            tables[f"block_table_{group}"] = table
        return tables

    # -- decode ----------------------------------------------------------------------

    def _decode(self, launch: list[Request]) -> dict[Request, StepResult]:
        rows, per_rank = [], Counter()
        for request in launch:
            rows.append((request.rank, per_rank[request.rank], request))
            per_rank[request.rank] += 1
        batch = self.spec.contract.DECODE_LAYOUTS[self.k].batch
        # the last position a row reaches is its tail's + k (the drafts)
        context = max(request.num_tokens + self.k for request in launch)
        common = dict(pools=self.pools, weights=self.params, context=context,
                      **self._tables(rows, batch))
        if self.k:
            return self._decode_mtp(rows, batch, common)
        shape = (self.spec.contract.RANKS, batch)
        tokens, positions = np.zeros(shape + (1,), np.int64), np.zeros(shape, np.int32)
        lens = np.zeros(shape, np.int32)
        for rank, row, request in rows:
            tokens[rank, row, 0] = request.token_ids[-1]
            positions[rank, row], lens[rank, row] = request.num_tokens - 1, 1
        out = self._launch(self.decode, self.decode_name, token_ids=tokens, positions=positions,
                           row_lens=lens, **common)
        return {request: self._sample(request, out.logits[rank, row, 0])
                for rank, row, request in rows}

    @property
    def decode_name(self) -> str:
        return self.spec.contract.DECODE_LAYOUTS[self.k].kernel

    def _decode_mtp(self, rows, batch: int, common: dict) -> dict[Request, StepResult]:
        shape = (self.spec.contract.RANKS, batch)
        slot_ids, gens = np.full(shape, -1, np.int32), np.zeros(shape, np.int64)
        for rank, row, request in rows:
            slot_ids[rank, row], gens[rank, row] = request.slot, request.slot_generation
        out = self._launch(self.decode, self.decode_name, slot_ids=slot_ids, slot_gens=gens,
                           mtp=self.mtp, **common)
        return {request: self._isolated(self._verify, request, out, rank, row)
                for rank, row, request in rows}

    def _verify(self, request: Request, out, rank: int, row: int) -> StepResult:
        """Verify the row's draft, then set the slot for the request's next fused decode."""
        draft = int(out.draft_ids[rank, row, 0])
        tokens = sampler.verify_draft(out.logits[rank, row], draft, request.params,
                                      request.prompt_ids, request.output_ids,
                                      self._generator(request))
        logprobs = self._logprobs(request, out.logits[rank, row, : len(tokens)], tokens)
        tail_pos = request.num_tokens - 1 + len(tokens)
        self._set_slot(request, tokens[-1], tail_pos, out.hidden[rank, row, len(tokens) - 1])
        return StepResult(tokens, logprobs, drafted=self.k, accepted=len(tokens) - 1)

    def _set_slot(self, request: Request, tail: int, tail_pos: int, hidden: torch.Tensor) -> None:
        """The slot's state for the next fused decode: tail token and position, committed
        count, generation, and the streams of the row before the tail."""
        field = self.spec.pools.MtpField
        row = self.mtp.slots[request.rank, request.slot]
        row[field.TAIL_TOKEN], row[field.TAIL_POS] = tail, tail_pos
        row[field.COMMITTED], row[field.GENERATION] = tail_pos + 1, request.slot_generation
        self.mtp.hidden[request.rank, request.slot] = hidden

    # -- prefill ---------------------------------------------------------------------

    def _prefill(self, chunks: list[PrefillChunk]) -> dict[Request, StepResult]:
        c = self.spec.contract
        extent = max(c.dispatch_extent(ch.length) for ch in chunks)
        shape = (c.RANKS, c.SLOTS_PER_RANK)
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
        results = {}
        for ch in chunks:
            r = ch.request
            if ch.terminal and not r.output_ids:   # a fresh prompt's first token
                results[r] = self._sample(r, out.logits[r.rank, ch.slot])
        alive = [ch for ch in chunks if ch.request not in results or not results[ch.request].error]
        if self.k and alive:
            self._prefill_mtp(alive, out.mtp_hidden, results)
        return results

    def _prefill_mtp(self, chunks: list[PrefillChunk], hidden: torch.Tensor,
                     results: dict[Request, StepResult]) -> None:
        """Rebuild the MTP layer's window from the chunk's last rows; a terminal chunk
        then fills the request's slot for its first fused decode."""
        c = self.spec.contract
        rows = [(ch.request.rank, ch.slot, ch.request) for ch in chunks]
        shape = (c.RANKS, c.SLOTS_PER_RANK)
        next_ids = np.zeros(shape + (c.MTP_WINDOW,), np.int64)
        starts, nrows = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
        for ch in chunks:
            r, width = ch.request, min(c.MTP_WINDOW, ch.length)
            known = r.token_ids + (results[r].tokens if r in results else [])
            next_ids[r.rank, ch.slot, :width] = known[ch.end - width + 1: ch.end + 1]
            starts[r.rank, ch.slot], nrows[r.rank, ch.slot] = ch.end - width, width
        tables = self._tables(rows, c.SLOTS_PER_RANK)
        self._launch(self.prefill_mtp, "prefill_mtp", mtp_hidden=hidden, next_ids=next_ids,
                     start_pos=starts, num_rows=nrows, block_table_ori=tables["block_table_ori"],
                     pools=self.pools, weights=self.params)
        for ch in chunks:
            if ch.terminal:
                r, width = ch.request, min(c.MTP_WINDOW, ch.length)
                tail = results[r].tokens[-1] if r in results else r.token_ids[-1]
                self._set_slot(r, tail, ch.end, hidden[r.rank, ch.slot, width - 1])

    # -- sampling --------------------------------------------------------------------

    def _generator(self, request: Request) -> torch.Generator | None:
        if request.params.greedy:
            return None
        if request.request_id not in self._generators:
            gen = torch.Generator(device=self.device)
            seed = request.params.generator_seed
            gen.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
            self._generators[request.request_id] = gen
        return self._generators[request.request_id]

    def _isolated(self, compute, request: Request, *args) -> StepResult:
        """One request's share of the step's host work (sampling, logits processing);
        its failure is that request's alone and comes back as StepResult.error."""
        t0 = time.perf_counter()
        try:
            return compute(request, *args)
        except Exception as exc:  # noqa: BLE001 - isolated to this request
            return StepResult([], error=exc)
        finally:
            self.timing.sample += time.perf_counter() - t0

    def _sample(self, request: Request, logits: torch.Tensor) -> StepResult:
        return self._isolated(self._sample_one, request, logits)

    def _sample_one(self, request: Request, logits: torch.Tensor) -> StepResult:
        token = sampler.sample(logits, request.params, request.prompt_ids, request.output_ids,
                               self._generator(request))
        return StepResult([token], self._logprobs(request, logits[None], [token]))

    def _logprobs(self, request: Request, logits: torch.Tensor,
                  tokens: list[int]) -> list[TokenLogprobs] | None:
        """The model's log-probs (before sampling adjustments) of each committed token."""
        n = request.params.logprobs
        if n is None:
            return None
        lp = torch.log_softmax(logits.float(), dim=-1)
        out = []
        for row, token in zip(lp, tokens):
            top = row.topk(n) if n else None
            pairs = list(zip(top.indices.tolist(), top.values.tolist())) if n else []
            out.append(TokenLogprobs(token, float(row[token]), pairs))
        return out
