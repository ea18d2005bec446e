"""The scheduler: admission, per-step planning, preemption. Torch-free, I/O-free.

Every step plans decode first, then prefill, per rank:

    decode   every running request past its prefill, one row each (K+1 tokens); its
             blocks for all K+1 positions are reserved before dispatch. When a rank runs
             out, its latest-arrived running request is preempted (recompute) until the
             row fits or the request itself was the one preempted.
    prefill  up to `slots_per_rank` chunks per rank: unfinished prefills first, then
             admissions. A chunk is min(remaining, effective extent, the rank's token
             budget left) tokens; the runner pads it to the tile.
    admit    the head of the queue goes to the least-loaded rank that can supply its
             first chunk's blocks (and an MTP slot); ties rotate. It stays there. The
             queue (runtime/core/waiting_queue.py) puts preempted requests first, then
             takes turns between the bodies requests came from, each in arrival order.
    share    before all of that, while every slot is taken: a body with nothing
             running that waits gets a row of the body running the most (preempted),
             if that body runs more than its share of max_num_seqs (`_share_slots`).

A decode row of a request of n tokens writes positions n - 1 .. n - 1 + K: the step's K
is at most max_model_len - n for every row (`_width`), so no row's context passes
max_model_len (nor the last context bucket, which the kernels cannot take); its blocks
are reserved for that many positions, which admission checks a rank can hold. For the
last tokens before the limit a step runs fewer drafts than the policy chose (the
largest K served at or below the cap), and the engine reports the K that ran.

Blocks, prefix-cache hits and saves are the CacheManager's (runtime/core/cache_manager.py):
the scheduler asks it what a request needs and puts the pages and copies it plans into
the step's output. With prefix caching, admission first looks up the request's block
keys on every rank: it goes to the rank holding its longest cached prefix unless that
rank runs more than `prefix_affinity` requests beyond the least-loaded rank that can take
it. A hit of J blocks holds their pages and starts the request at J * block_size (at
least one prompt token is always computed).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from runtime.core.block_pool import BlockPool
from runtime.core.cache_manager import (
    CacheManager,
    Hit,
    PageCopy,
    Pin,
    Save,
    sources,
    too_large,
)
from runtime.core.mtp_slots import SlotTable
from runtime.core.prefix_cache import CacheStats, Layout
from runtime.core.request import Request, Status
from runtime.core.speculation import Speculation
from runtime.core.waiting_queue import WaitingQueue, group_key

_ARRIVAL = attrgetter("arrival")


@dataclass(frozen=True)
class SchedulerConfig:
    ranks: int
    prefill_slots: int            # chunks per rank per prefill launch
    decode_batch: int             # rows per rank per decode launch (the widest K's)
    micro_batches: int            # decode launches of decode_batch rows per step, at most
    k: int                        # speculative tokens per decode row, at most (0 = MTP off)
    effective_extent: int         # most tokens of one prefill chunk
    max_num_batched_tokens: int   # per rank per step
    max_num_seqs: int
    max_model_len: int
    chunked_prefill: bool = True
    prefix_affinity: int = 4      # running requests a prefix hit may outweigh
    # a group (HTTP body) with nothing running, waiting while every slot is taken, has a
    # row of the largest group preempted for its first request (_share_slots)
    fair_share: bool = True
    # rows per rank per launch of a step of each K (index K; 0: not served); empty:
    # decode_batch for every K
    batches: tuple[int, ...] = ()

    def batch(self, k: int) -> int:
        """Rows per rank per decode launch of a step of K drafts."""
        return self.batches[k] if self.batches else self.decode_batch

    @property
    def max_running_per_rank(self) -> int:
        return self.decode_batch * self.micro_batches


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    slot: int          # prefill slot of the request's rank in this launch
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def terminal(self) -> bool:
        """The chunk completes the request's prefill."""
        return self.end == _prefill_target(self.request)


@dataclass
class SchedulerOutput:
    # Decode launches; a request's row is its index among its rank's requests in the launch.
    decode: list[list[Request]] = field(default_factory=list)
    k: int | None = None          # the decode launches' drafts (None: the runner's K)
    keep_slots: bool = True       # K=0 of a runner that switches K: the twin kernel runs
    prefill: list[PrefillChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    fresh_blocks: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    fresh_slots: list[Request] = field(default_factory=list)   # admitted: new slot owners
    # prefix caching, in the runner's order: `saves` first (before any page is cleared),
    # then `restores` (after), then the prefill, split at the boundaries of `snapshots`
    saves: list[Save] = field(default_factory=list)
    restores: list[PageCopy] = field(default_factory=list)
    snapshots: list[Save] = field(default_factory=list)
    pins: list[Pin] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill and not self.saves

    def prefill_launches(self) -> list[list[PrefillChunk]]:
        """The step's main prefills: each chunk cut at the boundaries of its snapshots
        that lie inside it (so that the ring stands at each when it is copied); launch i
        carries piece i of every chunk."""
        cuts: dict[int, list[int]] = {}
        for save in self.snapshots:
            cuts.setdefault(id(save.request), []).append(save.boundary)
        launches: list[list[PrefillChunk]] = []
        for ch in self.prefill:
            at = ch.start
            inside = sorted(b for b in cuts.get(id(ch.request), ()) if ch.start < b < ch.end)
            for i, point in enumerate(inside + [ch.end]):
                if len(launches) == i:
                    launches.append([])
                launches[i].append(PrefillChunk(ch.request, ch.slot, at, point - at))
                at = point
        return launches


def refusal(num_tokens: int, config: SchedulerConfig,
            formulas: Mapping[str, Callable[[int], int]],
            capacity: Mapping[str, int]) -> str | None:
    """Why a prompt of `num_tokens` tokens can never run under `config` on ranks of
    `capacity` blocks per group (`formulas`: the blocks n positions take), or None. The
    one admission rule: the scheduler applies it to what it is given, the API server
    before it accepts a request."""
    if not config.chunked_prefill and num_tokens > config.effective_extent:
        return (f"prompt of {num_tokens} tokens exceeds one prefill dispatch "
                f"({config.effective_extent}) and chunked prefill is disabled")
    if num_tokens >= config.max_model_len:
        return (f"prompt of {num_tokens} tokens leaves no room to generate under "
                f"max_model_len {config.max_model_len}")
    # the prompt and its first decode step (its drafts capped at the context's end)
    first = min(num_tokens + 1 + config.k, config.max_model_len)
    short = too_large(first, formulas, capacity)
    return f"a prompt of {num_tokens} tokens needs {short}" if short else None


def _prefill_target(request: Request) -> int:
    """Tokens whose KV a prefill computes: all known ones but a generated tail."""
    return request.num_tokens - (1 if request.output_ids else 0)


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool,
                 block_formulas: Mapping[str, Callable[[int], int]],
                 slots: SlotTable | None = None, layout: Layout | None = None,
                 speculation: Speculation | None = None):
        self.config, self.slots = config, slots
        self.speculation = speculation or Speculation(config.k)
        self.cache = CacheManager(pool, block_formulas, layout, config.k)
        self.waiting = WaitingQueue()
        self.running: list[list[Request]] = [[] for _ in range(config.ranks)]
        self._next_rank = 0   # round-robin pointer for admission ties
        self.num_preemptions = 0

    # the cache manager's, read by the engine's metrics and by tests
    @property
    def pool(self) -> BlockPool:
        return self.cache.pool

    @property
    def layout(self) -> Layout | None:
        return self.cache.layout

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    # -- requests in and out ---------------------------------------------------------

    def check(self, request: Request) -> str | None:
        """Why `request` can never run under this configuration, or None."""
        return refusal(request.num_tokens, self.config, self.cache.formulas,
                       self.cache.pool.capacity)

    def add(self, request: Request) -> None:
        reason = self.check(request)
        if reason:
            raise ValueError(reason)
        self.waiting.append(request)

    def finish(self, request: Request, reason: str, stop_reason: int | str | None = None) -> None:
        """End a request (finished, aborted or rejected) and free what it holds; a request
        that already ended keeps its first reason."""
        if request.finished:
            return
        if request.status is Status.RUNNING:
            self._release(request)
            self.running[request.rank].remove(request)
        else:                   # waiting (O(1)), or not queued yet (a grammar compiling)
            self.waiting.discard(request)
        request.status, request.finish_reason = Status.FINISHED, reason
        request.stop_reason = stop_reason

    def has_work(self) -> bool:
        return bool(self.waiting) or any(self.running) or self.cache.has_finals()

    @property
    def num_running(self) -> int:
        return sum(len(r) for r in self.running)

    # -- one step --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(saves=self.cache.take_finals())
        self._share_slots(out)
        budget = [self.config.max_num_batched_tokens] * self.config.ranks
        rows = [self._schedule_decode(rank, out, budget) for rank in range(self.config.ranks)]
        count = sum(map(len, rows))
        out.k = self._choose_k([r for rank in rows for r in rank]) if count else self.config.k
        out.keep_slots = self.speculation.keep_slots
        out.decode = self._launches(rows, self.config.batch(out.k))
        used = [0] * self.config.ranks
        for rank in range(self.config.ranks):
            prefilling = sorted((r for r in self.running[rank] if r.prefilling),
                                key=lambda r: r.arrival)
            for request in prefilling:
                if request.status is Status.RUNNING:
                    self._schedule_chunk(request, out, budget, used, preempt=True)
        self._admit(out, budget, used)
        out.saves += self.cache.saves_passed(r for running in self.running for r in running)
        return out

    def _full(self) -> bool:
        """No running slot is free, on any rank."""
        return self.num_running >= self.config.max_num_seqs or all(
            len(running) >= self.config.max_running_per_rank for running in self.running)

    def _share_slots(self, out: SchedulerOutput) -> None:
        """While every slot is taken, a waiting request whose group has nothing running
        gets the slot of the latest-admitted row of the group running the most, if that
        group runs more than its share (max_num_seqs over the running groups and this
        one): the row is preempted (recompute: its prefix-cache entries stay), and the
        request admitted ahead of it this step. So a body whose requests fill the batch
        for their whole length (n 64 of long outputs) holds another body's first token
        for a step, not for their length; each preemption admits a group that had
        nothing running, so they are at most one per such arrival."""
        if not (self.config.fair_share and self.waiting and self._full()):
            return
        rows = Counter(group_key(r) for running in self.running for r in running)
        largest, held = rows.most_common(1)[0]
        if held <= max(1, self.config.max_num_seqs // (len(rows) + 1)):
            return
        newcomer = self.waiting.take_idle(lambda key: key not in rows)
        if newcomer is None:
            return
        victim = max((r for running in self.running for r in running
                      if group_key(r) == largest), key=_ARRIVAL)
        self._preempt(victim, out)
        self.waiting.appendleft(newcomer)         # ahead of the row it displaced

    def _choose_k(self, rows: list[Request]) -> int:
        """The step's K from the speculation policy: for the step's throughput while
        requests wait; while none waits, a finished row's place stays empty, so for the
        soonest end of the batch's last row (each row's tokens left: its max_tokens, or
        the context, whichever ends it first)."""
        acceptance = [r.acceptance for r in rows]
        if self.waiting:
            k = self.speculation.choose(acceptance)
        else:
            left = [max(1, min(r.params.max_tokens - len(r.output_ids),
                               self.config.max_model_len - r.num_tokens)) for r in rows]
            k = self.speculation.choose(acceptance, left)
        return self._served(min([k] + [self._width(r) for r in rows]))

    def _width(self, request: Request) -> int:
        """The most drafts a decode row of the request may run: its positions end at
        max_model_len - 1 (a decoding request has at most max_model_len - 1 tokens: at
        least one)."""
        return max(0, min(self.config.k, self.config.max_model_len - request.num_tokens))

    def _served(self, k: int) -> int:
        """The largest K at or below `k` that has decode launches: a spec may declare no
        layout between two Ks (the served ones, config.batches, include the largest at
        or below every cap: runtime/core/speculation.py's step_ks)."""
        while k and self.config.batches and not self.config.batch(k):
            k -= 1
        return k

    def _schedule_decode(self, rank: int, out: SchedulerOutput,
                         budget: list[int]) -> list[Request]:
        rows = []
        tokens = self.config.k + 1
        for request in sorted(self.running[rank], key=_ARRIVAL):
            if request.status is not Status.RUNNING or request.prefilling:
                continue
            need = self.cache.need(request, request.num_tokens + self._width(request))
            if need:                          # most steps: its blocks hold the row
                while not self.cache.can_allocate(rank, need):
                    victim = max(self.running[rank], key=lambda r: r.arrival)
                    self._preempt(victim, out)
                    if victim is request:
                        break
                if request.status is not Status.RUNNING:
                    continue
                self._take(request, need, out)
            rows.append(request)
            budget[rank] -= tokens
        return rows

    def _prefill_victim(self, request: Request, out: SchedulerOutput) -> Request | None:
        """The latest arrival on the request's rank after it, not yet in this step."""
        scheduled = {id(r) for launch in out.decode for r in launch}
        scheduled |= {id(ch.request) for ch in out.prefill}
        later = [r for r in self.running[request.rank]
                 if r.arrival > request.arrival and id(r) not in scheduled]
        return max(later, key=lambda r: r.arrival, default=None)

    def _launches(self, rows: list[list[Request]], batch: int) -> list[list[Request]]:
        """Cut each rank's rows into micro-batches of `batch` rows; launch i takes batch i
        of every rank."""
        count = max((-(-len(r) // batch) for r in rows), default=0)
        return [[req for r in rows for req in r[i * batch:(i + 1) * batch]] for i in range(count)]

    def _schedule_chunk(self, request: Request, out: SchedulerOutput, budget: list[int],
                        used: list[int], preempt: bool = False) -> bool:
        """Schedule the request's next chunk. With `preempt`, make room by preempting
        later arrivals on its rank that this step has not scheduled."""
        rank = request.rank
        length = self._chunk_length(request, budget[rank])
        if used[rank] >= self.config.prefill_slots or length <= 0:
            return False
        need = self.cache.need(request, request.num_computed + length)
        while not self.cache.can_allocate(rank, need):
            victim = self._prefill_victim(request, out) if preempt else None
            if victim is None:
                return False
            self._preempt(victim, out)
        self._take(request, need, out)
        out.prefill.append(PrefillChunk(request, used[rank], request.num_computed, length))
        out.snapshots += self.cache.snapshots(request, request.num_computed + length)
        used[rank] += 1
        budget[rank] -= length
        return True

    def _chunk_length(self, request: Request, budget: int, start: int | None = None) -> int:
        remaining = _prefill_target(request) - (request.num_computed if start is None else start)
        length = min(remaining, self.config.effective_extent, budget)
        if not self.config.chunked_prefill and length < remaining:
            return 0
        return length

    def _admit(self, out: SchedulerOutput, budget: list[int], used: list[int]) -> None:
        while self.waiting and self.num_running < self.config.max_num_seqs:
            request = self.waiting.peek()
            if request in out.preempted:   # not back on the step that preempted it
                return
            picked = self._pick_rank(request, budget, used)
            if picked is None:
                return
            rank, hit = picked
            self.waiting.popleft()
            request.status, request.rank = Status.RUNNING, rank
            self.cache.admit(request, hit, _prefill_target(request))
            self.running[rank].append(request)
            if self.slots is not None:
                request.slot, request.slot_generation = self.slots.acquire(rank)
                out.fresh_slots.append(request)
            self._schedule_chunk(request, out, budget, used)
            if hit:     # the ring pages its first chunk took are the copies' targets
                copies, pin = self.cache.restore(request, hit)
                out.restores += copies
                out.pins.append(pin)

    def _pick_rank(self, request: Request, budget: list[int],
                   used: list[int]) -> tuple[int, Hit] | None:
        """The rank for the request and its cached prefix there: the least-loaded rank
        that can take its first chunk (ties rotate), unless a rank holding a longer
        prefix runs at most `prefix_affinity` requests more."""
        ranks, full_budget = self.config.ranks, self.config.max_num_batched_tokens
        fits, later = [], []      # ranks that can take it now; in a step of their own
        upto = _prefill_target(request) - 1       # at least one prompt token is computed
        for rank in (self._next_rank + i for i in range(ranks)):
            rank %= ranks
            hit = self.cache.lookup(request, rank, upto)
            if self._can_host(request, rank, budget[rank], used[rank], hit):
                fits.append((rank, hit))
            elif hit and self._can_host(request, rank, full_budget, 0, hit):
                later.append((rank, hit))
        if not fits:
            return None
        load = lambda fit: len(self.running[fit[0]])  # noqa: E731
        least = min(fits, key=load)                       # stable: first in rotation
        best = max(fits + later, key=lambda fit: (len(fit[1]), -load(fit)))
        if len(best[1]) <= len(least[1]) \
                or load(best) - load(least) > self.config.prefix_affinity:
            best = least
        elif best not in fits:       # its rank's prefill is full this step: wait for it
            return None
        self._next_rank = (best[0] + 1) % ranks
        return best

    def _can_host(self, request: Request, rank: int, budget: int, used: int,
                  hit: Hit) -> bool:
        if len(self.running[rank]) >= self.config.max_running_per_rank:
            return False
        if used >= self.config.prefill_slots or (self.slots and not self.slots.can_acquire(rank)):
            return False
        start = self.cache.cached_tokens(hit)
        length = self._chunk_length(request, budget, start)
        return length > 0 and self.cache.can_admit(rank, start + length, hit)

    def commit(self, out: SchedulerOutput,
               results: Mapping[Request, Sequence[int]]) -> dict[Request, list[int]]:
        """Advance what each launched request has computed, then append its sampled
        tokens up to the first token-level stop (EOS, stop token, max_tokens,
        max_model_len). Returns the tokens each request kept. A request that ended
        during the step (it failed) has no result and is skipped, and its saves make no
        prefix-cache entry: a launch that failed may have left its pages half written."""
        for chunk in out.prefill:
            if not chunk.request.finished:
                chunk.request.num_computed = chunk.end
        for launch in out.decode:
            for request in launch:   # the tail and the accepted drafts are now computed
                if not request.finished:
                    request.num_computed = request.num_tokens - 1 + len(results[request])
        kept = {request: self._append(request, tokens) for request, tokens in results.items()
                if not request.finished}
        saves, pins = [], list(out.pins)
        for save in out.saves + out.snapshots:
            if save.request.finish_reason == "error":      # its pages are let go only
                pins += [(save.rank, {g: [page] for g, page in save.pages.items()}),
                         (save.rank, sources(save.copies))]
            else:
                saves.append(save)
        self.cache.register(saves, pins)
        return kept

    def _append(self, request: Request, tokens: Sequence[int]) -> list[int]:
        kept = []
        for token in tokens:
            request.output_ids.append(token)
            kept.append(token)
            stop = self._stop(request, token)
            if stop:
                self.finish(request, *stop)
                break
        return kept

    def _stop(self, request: Request, token: int) -> tuple[str, int | None] | None:
        params = request.params
        if token == request.eos_token_id and not params.ignore_eos:
            return "stop", None
        if token in params.stop_token_set:
            return "stop", token
        if len(request.output_ids) >= params.max_tokens \
                or request.num_tokens >= self.config.max_model_len:
            return "length", None
        return None

    # -- blocks ----------------------------------------------------------------------

    def _take(self, request: Request, need: dict[str, int], out: SchedulerOutput) -> None:
        for group, ids in self.cache.allocate(request, need).items():
            out.fresh_blocks.setdefault((request.rank, group), []).extend(ids)

    def _release(self, request: Request) -> None:
        self.cache.free(request)
        if request.slot is not None:
            self.slots.release(request.rank, request.slot)
            request.slot = None

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Free everything and queue the request again at the front (recompute)."""
        self._release(request)
        self.running[request.rank].remove(request)
        request.status, request.rank, request.num_computed = Status.WAITING, None, 0
        request.cached_blocks = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)
