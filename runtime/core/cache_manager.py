"""The pages of running requests and the prefix cache on them, beside the scheduler (as
vLLM's KVCacheManager sits beside its scheduler). Torch-free, I/O-free.

The scheduler decides who runs and how far; the manager decides which pages of the
rank's BlockPool that takes and, with a Layout (runtime/core/prefix_cache.py), which a
request inherits from the prefix cache and which it leaves there:

    admission   `lookup` a request's longest cached prefix on a rank, `can_admit` it
                there, `admit` it (hold the hit's pages); once its first chunk has its
                blocks, `restore` copies the hit's ring pages into its ring
    growth      `need`, `can_allocate`, `allocate`: blocks for more positions
    saves       each block boundary a request passes is saved as an entry:
                  in prefill  `snapshots`: a boundary inside or at the end of a chunk;
                              the runner copies the ring pages when its computation
                              stands there (it splits the launch there)
                  in decode   `saves_passed`: at the start of the step after the
                              boundary is passed, while the ring still holds its rows
                              (`Layout.reach`); so too when the request ends (`free`
                              plans it, `take_finals` hands it to the next step)
    commit      `register`: each save becomes an entry; pinned pages are let go
    end         `free`: every block of a request

Copies of a step pin the pages they read or fill until its commit, so a page a save
will read is never handed to another request first (an ending request's save runs in
the next step, after its own pages were freed).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from runtime.core.block_pool import BlockPool
from runtime.core.prefix_cache import CacheStats, Layout
from runtime.core.request import Request

Hit = list[dict[str, int]]                 # a cached prefix's entries, block 0 first
REACH_CAP = 1 << 40                         # positions beyond any context
Pin = tuple[int, dict[str, list[int]]]     # (rank, pages by group) held until the commit


@dataclass(frozen=True)
class PageCopy:
    rank: int
    group: str
    src: int
    dst: int


@dataclass
class Save:
    """A request's ring rows at `boundary` copied into cache pages; at commit, the entry
    of block boundary // block_size - 1 with `pages` (its full pages and the copies)."""

    request: Request
    rank: int
    boundary: int
    copies: list[PageCopy]
    pages: dict[str, int]


def sources(copies: list[PageCopy]) -> dict[str, list[int]]:
    """The pages copies read, by group (one copy per group)."""
    return {c.group: [c.src] for c in copies}


def too_large(positions: int, formulas: Mapping[str, Callable[[int], int]],
              capacity: Mapping[str, int]) -> str | None:
    """Why `positions` positions never fit a rank of `capacity` blocks per group (the
    first group short), or None."""
    for group, formula in formulas.items():
        if formula(positions) > capacity[group]:
            return (f"{formula(positions)} {group} blocks, more than a rank holds "
                    f"({capacity[group]})")
    return None


def _reach(formula: Callable[[int], int], blocks: int, start: int) -> int:
    """The most positions `blocks` blocks hold under `formula` (non-decreasing), given
    that they hold `start`: galloping, then bisection (a ring group at its pages holds
    any number: capped at REACH_CAP)."""
    if formula(REACH_CAP) <= blocks:
        return REACH_CAP
    lo, step = start, 1
    while formula(lo + step) <= blocks:
        lo += step
        step *= 2
    hi = lo + step                              # formula(hi) > blocks
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if formula(mid) <= blocks:
            lo = mid
        else:
            hi = mid
    return lo


class CacheManager:
    """Owns `pool` for the scheduler: a running request's `blocks` change only here."""

    def __init__(self, pool: BlockPool, block_formulas: Mapping[str, Callable[[int], int]],
                 layout: Layout | None = None, k: int = 0):
        self.pool, self.layout = pool, layout        # layout None: no prefix caching
        self.k = k                                   # a decode step writes positions up
        #                                              to num_computed + k (tail and drafts)
        self.formulas = dict(block_formulas)         # group -> blocks for n positions
        self._full = set(layout.full) if layout else set()
        self.stats = CacheStats.zeros(pool.ranks)
        self._finals: list[Save] = []                # saves of ended requests, for the next step

    # -- blocks ----------------------------------------------------------------------

    def too_large(self, positions: int) -> str | None:
        return too_large(positions, self.formulas, self.pool.capacity)

    def need(self, request: Request, num_tokens: int) -> dict[str, int]:
        """New blocks per group for the request to hold `num_tokens` positions (the
        groups that need some; empty while its blocks hold them, as on most steps: then
        one comparison with the reach found when they last sufficed)."""
        if num_tokens <= request.reach:
            return {}
        held = request.blocks
        need = {}
        for g, f in self.formulas.items():
            more = f(num_tokens) - len(held.get(g, ()))
            if more > 0:
                need[g] = more
        if not need:
            request.reach = min(_reach(f, len(held.get(g, ())), num_tokens)
                                for g, f in self.formulas.items())
        return need

    def can_allocate(self, rank: int, need: Mapping[str, int]) -> bool:
        return self.pool.can_allocate(rank, need)

    def allocate(self, request: Request, need: Mapping[str, int]) -> dict[str, list[int]]:
        """Append `need` new blocks to the request's; returns them (groups with none left
        out)."""
        if not need:
            return {}
        fresh = self.pool.allocate(request.rank, need)
        for group, ids in fresh.items():
            request.blocks[group].extend(ids)
        return fresh

    def free(self, request: Request) -> None:
        """Give back every block of the request; with prefix caching, first plan the save
        of the boundary it passed last (its pages are read before another owner's)."""
        if self.layout is not None:
            self._keep_final(request)
        self.pool.free(request.rank, request.blocks)
        request.blocks, request.reach = {}, 0

    # -- admission -------------------------------------------------------------------

    def lookup(self, request: Request, rank: int, upto: int) -> Hit:
        """The entries of the request's longest cached prefix on `rank` that ends at or
        before position `upto`."""
        if self.layout is None:
            return []
        entries = []
        for key in self.layout.keys(request, self.layout.max_blocks(request, upto)):
            entry = self.pool.get(rank, key)
            if entry is None:
                break
            entries.append(entry)
        return entries

    def cached_tokens(self, hit: Hit) -> int:
        """Where a request with `hit` starts computing."""
        return len(hit) * self.layout.block_size if hit else 0

    def can_admit(self, rank: int, end: int, hit: Hit) -> bool:
        """Whether a request inheriting `hit` on `rank` can hold positions up to `end`."""
        inherited = len(hit)
        need = {g: max(0, f(end) - (inherited if g in self._full else 0))
                for g, f in self.formulas.items()}
        return self.pool.can_allocate(rank, need, self._held_by(hit))

    def admit(self, request: Request, hit: Hit, queried: int) -> None:
        """Give the request (on its rank now) empty block lists; count the lookup of
        `queried` prompt tokens; hold a hit's pages and start the request at its
        boundary. The hit's ring pages stay held until `restore`'s pin is let go."""
        request.blocks, request.reach = {g: [] for g in self.formulas}, 0
        if self.layout is None:
            return
        cached = self.cached_tokens(hit)
        self.stats.add(request.rank, queried, cached)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = cached
        if not hit:
            return
        held = self._held_by(hit)
        self.pool.hold(request.rank, held)
        for g in self.layout.full:
            request.blocks[g] = held[g]
        request.num_computed, request.cached_blocks = cached, len(hit)

    def restore(self, request: Request, hit: Hit) -> tuple[list[PageCopy], Pin]:
        """Copies of the last hit entry's ring pages into the request's ring (its blocks
        allocated), where the rows before its boundary go; and the pin on the pages they
        read, held since `admit`."""
        boundary, entry = len(hit) * self.layout.block_size, hit[-1]
        copies = [PageCopy(request.rank, g,
                           entry[g], request.blocks[g][self.layout.ring_entry(g, boundary)])
                  for g in self.layout.ring]
        return copies, (request.rank, sources(copies))

    def _held_by(self, hit: Hit) -> dict[str, list[int]]:
        """The pages a hit holds: every entry's full pages, the last entry's ring copies
        (until they are restored)."""
        if not hit:
            return {}
        pages = {g: [e[g] for e in hit] for g in self.layout.full}
        return pages | {g: [hit[-1][g]] for g in self.layout.ring}

    # -- saves -----------------------------------------------------------------------

    def snapshots(self, request: Request, end: int) -> list[Save]:
        """Saves of the boundaries a chunk from the request's `num_computed` to `end`
        passes (the runner takes them during the prefill)."""
        saves: list[Save] = []
        if self.layout is None:
            return saves
        b = self.layout.block_size
        request.cached_blocks = max(request.cached_blocks, request.num_computed // b)
        while (request.cached_blocks + 1) * b <= end:
            request.cached_blocks += 1
            self._save(request, request.cached_blocks * b, saves)
        return saves

    def saves_passed(self, requests: Iterable[Request]) -> list[Save]:
        """Saves of the boundaries decoding `requests` passed in the last step."""
        saves: list[Save] = []
        if self.layout is None:
            return saves
        for request in requests:
            boundary = None if request.prefilling else self._last_passed(request)
            if boundary is not None:
                self._save(request, boundary, saves)
        return saves

    def take_finals(self) -> list[Save]:
        """The saves of requests that ended since the last call: the step's first."""
        finals, self._finals = self._finals, []
        return finals

    def has_finals(self) -> bool:
        return bool(self._finals)

    def _last_passed(self, request: Request) -> int | None:
        """The last boundary a computed request passed and has not saved, if its ring
        still holds it; the ones before it are given up."""
        layout, b = self.layout, self.layout.block_size
        boundary = None
        while (request.cached_blocks + 1) * b + layout.lookahead <= request.num_computed:
            request.cached_blocks += 1
            boundary = request.cached_blocks * b
        if boundary is None or request.num_computed + self.k > boundary + layout.reach:
            return None
        return boundary

    def _keep_final(self, request: Request) -> None:
        """Before an ending request's pages are freed: a save of the boundary it passed
        last, taken at the start of the next step (its ring pages are read before any
        page is cleared or written)."""
        boundary = self._last_passed(request)
        if boundary is not None:
            self._save(request, boundary, self._finals)

    def _save(self, request: Request, boundary: int, saves: list[Save]) -> None:
        """Plan a save of the request's state at `boundary` (unless its entry exists or
        no page is free): new pages for the ring copies. Until the commit of the step
        that copies, the save holds its full pages of the block before `boundary` and
        the ring pages it reads: a request that ends (or is preempted) before the copy
        runs frees its pages, and no other request may take and write one meanwhile."""
        layout, rank = self.layout, request.rank
        j = boundary // layout.block_size - 1
        if layout.max_blocks(request, boundary) > j \
                and self.pool.get(rank, layout.keys(request, j + 1)[j]) is not None:
            return
        need = {g: 1 for g in layout.ring}
        if not self.pool.can_allocate(rank, need):
            return
        fresh = {g: ids[0] for g, ids in self.pool.allocate(rank, need).items()}
        full = {g: request.blocks[g][j] for g in layout.full}
        copies = [PageCopy(rank, g, request.blocks[g][layout.ring_entry(g, boundary)],
                           fresh[g]) for g in layout.ring]
        self.pool.hold(rank, {g: [i] for g, i in full.items()} | sources(copies))
        saves.append(Save(request, rank, boundary, copies, full | fresh))

    # -- commit ----------------------------------------------------------------------

    def register(self, saves: Iterable[Save], pins: Iterable[Pin]) -> None:
        """After the step: each save whose key the request's tokens now give becomes an
        entry; every page a copy pinned is let go."""
        layout = self.layout
        for save in saves:
            j = save.boundary // layout.block_size - 1
            if layout.max_blocks(save.request, save.boundary) > j:
                self.pool.put(save.rank, layout.keys(save.request, j + 1)[j], save.pages)
            self.pool.free(save.rank, {g: [i] for g, i in save.pages.items()})
            self.pool.free(save.rank, sources(save.copies))
        for rank, pages in pins:
            self.pool.free(rank, pages)
