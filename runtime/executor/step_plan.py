"""A step as the rank workers receive it: a diff against what they already hold, written by
the engine (PlanWriter) and read back on every rank (PlanReader) into the SchedulerOutput
its ModelRunner takes. The messages are plan_messages.py's (msgpack, no pickle).

Each side keeps one record per live request, under a handle (a small integer):

    engine  PlanWriter   what the ranks hold of each request: output tokens sent, its
                         placement (rank, slot, generation), and per group the block list
                         it last sent and how many ids of it
    ranks   PlanReader   a mirror of each request (a runtime.core.request.Request): the
                         prompt, params and eos once, then the outputs, placement and
                         blocks as the syncs change them

A handle is given back when the engine forgets its request, after the Plan that says so
(an ended request's last prefix-cache save may be in it), and reused, smallest first.

A request's first Plan carries its Intro (the prompt: a 1M-token prompt travels once).
Every Plan then carries a Sync for each request it refers to whose state changed: the
tokens appended since, the block ids appended per group (blocks only ever grow between
admissions), or, after a (re)admission, a preemption or its end, a Placement with the
block lists whole (the scheduler replaces a request's lists then; the writer sees that
by identity). A steady decode row costs its handle in a launch and a Sync of its new
tokens: a few bytes, whatever the context length.

The mirrors keep what the runner reads exactly as the engine had it at schedule time:
prompt_ids, output_ids, params, rank, slot, slot_generation, blocks (appended in place,
replaced on re-admission, as the engine's are), and num_computed of the step's rows (a
chunk's start; a decode row's tail is its only token not computed). One mirror object
per request for as long as it lives, so identity-based lookups (a snapshot's request
among the chunks', the runner's results) hold. Not sent: preempted and pins (the engine's
bookkeeping), status and the prefix-cache keys (the scheduler's).

A reader for rank R rebuilds that rank's share: its own requests with rank 0, every
decode launch (empty or not: each rank takes part in every launch), its pages, copies
and saves; the requests of other ranks are held too (with rank None), as one may come
to R on a re-admission. A reader without a rank rebuilds the whole step, ranks kept.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import msgspec

from runtime.core.cache_manager import PageCopy, Save
from runtime.core.request import Request
from runtime.core.scheduler import PrefillChunk, SchedulerOutput
from runtime.executor.plan_messages import (
    Chunk,
    Copy,
    Intro,
    Pages,
    Placement,
    Plan,
    SaveCopies,
    Sync,
)

# -- the engine's side --------------------------------------------------------------------


@dataclass
class _Sent:
    """What the ranks hold of one request. The engine's block dict is kept by reference:
    the scheduler gives a request a new dict at every admission and its end, and between
    two it only extends the dict's lists (runtime/core/cache_manager.py); so the same
    dict at the same placement has the lists last sent, grown or not."""

    request: Request
    outputs: int = 0                                      # output tokens sent
    place: tuple | None = None                            # (rank, slot, slot_generation)
    blocks: dict | None = None                            # the engine's dict, as last sent
    lengths: tuple[int, ...] = ()                         # its lists' lengths then

    def sync(self, handle: int) -> Sync | None:
        """The diff of the request since the last call (None: nothing changed)."""
        r = self.request
        tokens = r.output_ids[self.outputs:]
        self.outputs = len(r.output_ids)
        lengths = tuple(map(len, r.blocks.values()))
        placed, grown = None, {}
        place = (r.rank, r.slot, r.slot_generation)
        if r.blocks is not self.blocks or place != self.place:       # placed anew
            placed = Placement(r.rank, r.slot, r.slot_generation, r.blocks)
            self.place, self.blocks = place, r.blocks
        elif lengths != self.lengths:
            grown = {g: ids[n:] for (g, ids), n in zip(r.blocks.items(), self.lengths)
                     if len(ids) > n}
        self.lengths = lengths
        if not tokens and not grown and placed is None:
            return None
        return Sync(handle, tokens, grown, placed)


class PlanWriter:
    """The engine's end: each step's SchedulerOutput as the bytes of a Plan, given what
    the ranks already hold. Needs no process (a benchmark may count the bytes)."""

    def __init__(self):
        self._encoder = msgspec.msgpack.Encoder()
        self._sent: dict[int, _Sent] = {}            # handle -> what the ranks hold
        self._handles: dict[Request, int] = {}       # by identity
        self._by_id: dict[str, int] = {}             # request id -> its live request's handle
        self._free: list[int] = []                   # a heap of released handles
        self._intros: list[Intro] = []               # of the step being written
        self._syncs: dict[int, Sync | None] = {}

    def write(self, out: SchedulerOutput, extents: list[int], forget: list[str]) -> bytes:
        """The step's Plan. `forget`: the ids of requests the engine forgot since the
        last call (looked up before this step's new requests, which may reuse an id)."""
        gone = [self._by_id.pop(i) for i in forget if i in self._by_id]
        self._intros, self._syncs = [], {}
        plan = Plan(
            intros=self._intros, syncs=[],
            decode=[[self._ref(r) for r in launch] for launch in out.decode],
            prefill=[Chunk(self._ref(ch.request), ch.slot, ch.start, ch.length)
                     for ch in out.prefill],
            fresh_blocks=[Pages(rank, group, ids)
                          for (rank, group), ids in out.fresh_blocks.items()],
            fresh_slots=[self._ref(r) for r in out.fresh_slots],
            saves=[self._save(s) for s in out.saves],
            restores=[_copy(c) for c in out.restores],
            snapshots=[self._save(s) for s in out.snapshots],
            extents=extents, forget=gone, k=out.k, keep_slots=out.keep_slots)
        plan.syncs = [s for s in self._syncs.values() if s is not None]
        data = self._encoder.encode(plan)
        for handle in gone:
            self._drop(handle)
        return data

    def request(self, handle: int) -> Request:
        """The request of a live handle (a Reply's results name theirs)."""
        return self._sent[handle].request

    def _ref(self, request: Request) -> int:
        """The request's handle, its Intro (first time) and Sync (once per step) queued."""
        handle = self._handles.get(request)
        if handle is None:
            handle = self._introduce(request)
        if handle not in self._syncs:
            self._syncs[handle] = self._sent[handle].sync(handle)
        return handle

    def _introduce(self, request: Request) -> int:
        # handles 0 .. n-1 are live or free: with none free, n is the next
        handle = heapq.heappop(self._free) if self._free else len(self._sent)
        self._sent[handle] = _Sent(request)
        self._handles[request], self._by_id[request.request_id] = handle, handle
        self._intros.append(Intro(handle, request.request_id, request.prompt_ids,
                                  request.params, request.eos_token_id, request.arrival))
        return handle

    def _drop(self, handle: int) -> None:
        del self._handles[self._sent.pop(handle).request]
        heapq.heappush(self._free, handle)

    def _save(self, save: Save) -> SaveCopies:
        return SaveCopies(self._ref(save.request), save.rank, save.boundary,
                          [_copy(c) for c in save.copies], save.pages)


def _copy(c: PageCopy) -> Copy:
    return Copy(c.rank, c.group, c.src, c.dst)

# -- the ranks' side ----------------------------------------------------------------------


@dataclass
class Share:
    """One step as a reader rebuilt it: the runner's input, the extents of the main
    prefill launches over every rank, and the ids of the requests forgotten (the runner
    drops their streams and matchers)."""

    out: SchedulerOutput
    extents: list[int]
    forget: list[str]


class PlanReader:
    """A rank's end: Plans applied to the mirrors, each step rebuilt as rank `rank`'s
    share (its requests' rank made 0), or as the whole step if `rank` is None."""

    def __init__(self, rank: int | None = None):
        self.rank = rank
        self._decoder = msgspec.msgpack.Decoder(Plan)
        self._mirrors: dict[int, Request] = {}       # handle -> mirror
        self._ranks: dict[int, int | None] = {}      # handle -> global rank
        self._handles: dict[Request, int] = {}       # mirror -> handle, by identity

    def read(self, data: bytes) -> Share:
        return self.take(self._decoder.decode(data))

    def take(self, plan: Plan) -> Share:
        for intro in plan.intros:
            self._introduce(intro)
        for sync in plan.syncs:
            self._apply(sync)
        out = self._output(plan)
        return Share(out, plan.extents, [self._drop(h) for h in plan.forget])

    def handle(self, request: Request) -> int:
        """A mirror's handle (its results are sent under it)."""
        return self._handles[request]

    def mirrors(self) -> list[Request]:
        """Every live request held here."""
        return list(self._mirrors.values())

    def _introduce(self, intro: Intro) -> None:
        request = Request(intro.request_id, intro.prompt_ids, intro.params, intro.arrival,
                          intro.eos_token_id)
        self._mirrors[intro.handle], self._ranks[intro.handle] = request, None
        self._handles[request] = intro.handle

    def _apply(self, sync: Sync) -> None:
        request = self._mirrors[sync.handle]
        request.output_ids += sync.tokens
        if sync.placed is not None:
            p = sync.placed
            self._ranks[sync.handle], request.rank = p.rank, self._local(p.rank)
            request.slot, request.slot_generation, request.blocks = \
                p.slot, p.slot_generation, p.blocks
        for group, ids in sync.grown.items():
            request.blocks[group] += ids

    def _drop(self, handle: int) -> str:
        request = self._mirrors.pop(handle)
        del self._ranks[handle], self._handles[request]
        return request.request_id

    # -- the share ---------------------------------------------------------------------

    def _local(self, rank: int | None) -> int | None:
        """A global rank as the runner here sees it: 0 for this rank, None for others."""
        if self.rank is None:
            return rank
        return 0 if rank == self.rank else None

    def _here(self, rank: int | None) -> bool:
        return self.rank is None or rank == self.rank

    def _mine(self, handle: int) -> bool:
        return self._here(self._ranks[handle])

    def _output(self, plan: Plan) -> SchedulerOutput:
        mine, mirrors = self._mine, self._mirrors
        if self.rank is None:
            decode = [[mirrors[h] for h in launch] for launch in plan.decode]
        else:
            ranks, rank = self._ranks, self.rank
            decode = [[mirrors[h] for h in launch if ranks[h] == rank]
                      for launch in plan.decode]
        for request in (r for launch in decode for r in launch):
            request.num_computed = request.num_tokens - 1     # all but the tail
        prefill = [PrefillChunk(self._mirrors[c.handle], c.slot, c.start, c.length)
                   for c in plan.prefill if mine(c.handle)]
        for ch in prefill:
            ch.request.num_computed = ch.start
        return SchedulerOutput(
            decode=decode, k=plan.k, keep_slots=plan.keep_slots, prefill=prefill,
            fresh_blocks={(self._local(p.rank), p.group): p.ids for p in plan.fresh_blocks
                          if self._here(p.rank)},
            fresh_slots=[self._mirrors[h] for h in plan.fresh_slots if mine(h)],
            saves=self._saves(plan.saves), restores=self._copies(plan.restores),
            snapshots=self._saves(plan.snapshots))

    def _copies(self, copies: list[Copy]) -> list[PageCopy]:
        return [PageCopy(self._local(c.rank), c.group, c.src, c.dst) for c in copies
                if self._here(c.rank)]

    def _saves(self, saves: list[SaveCopies]) -> list[Save]:
        """A save keeps its own rank: its request may have ended or moved since."""
        return [Save(self._mirrors[s.handle], self._local(s.rank), s.boundary,
                     self._copies(s.copies), s.pages) for s in saves if self._here(s.rank)]
