"""Scheduler-owned block ids of every pool group on every rank. Torch-free, I/O-free.

A block id of group g on rank r names page id in every layer of g on that rank. A page
is referenced by the requests that hold it (and, for one step, by a copy that reads or
fills it); at zero references it is free. The scheduler asks for all the groups a step
needs at once: `can_allocate` then `allocate` (all or nothing).

A page may also belong to a prefix-cache entry (`put`, see runtime/core/prefix_cache.py). A
free page of an entry keeps its content and counts as free: allocation hands out plain
free pages first (the most recently freed first), then cached ones, least recently freed
first; taking a cached page drops its whole entry (its other pages turn plain). The
runner clears a page before its new owner uses it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping

Pages = Mapping[str, Iterable[int]]        # group -> block ids


class BlockPool:
    def __init__(self, blocks: Mapping[str, int], ranks: int):
        self.capacity = dict(blocks)
        self._plain = [{g: list(range(n - 1, -1, -1)) for g, n in blocks.items()}
                       for _ in range(ranks)]
        self._cached = [{g: OrderedDict() for g in blocks} for _ in range(ranks)]
        self._refs = [{g: [0] * n for g, n in blocks.items()} for _ in range(ranks)]
        self._entries: list[dict[Hashable, dict[str, int]]] = [{} for _ in range(ranks)]
        self._entry_of: list[dict[tuple[str, int], Hashable]] = [{} for _ in range(ranks)]
        self.evictions = [0] * ranks              # entries dropped to free a page, per rank

    @property
    def ranks(self) -> int:
        return len(self._plain)

    # -- free capacity -----------------------------------------------------------------

    def free_count(self, rank: int, group: str) -> int:
        """Free pages, cached ones included."""
        return len(self._plain[rank][group]) + len(self._cached[rank][group])

    def can_allocate(self, rank: int, need: Mapping[str, int],
                     holding: Pages | None = None) -> bool:
        """Whether `need` new pages fit after `holding` (pages about to be held, some of
        them free now) is held."""
        if not need:
            return True
        taken = self._free_among(rank, holding or {})
        return all(self.free_count(rank, g) - taken.get(g, 0) >= n for g, n in need.items())

    def _free_among(self, rank: int, pages: Pages) -> dict[str, int]:
        refs = self._refs[rank]
        return {g: sum(1 for i in set(ids) if refs[g][i] == 0) for g, ids in pages.items()}

    def used(self, rank: int, group: str) -> int:
        return self.capacity[group] - self.free_count(rank, group)

    def usage(self, rank: int) -> float:
        """The fullest group's used fraction on `rank` (what limits admission)."""
        return max(self.used(rank, g) / n for g, n in self.capacity.items() if n)

    # -- holding pages -----------------------------------------------------------------

    def allocate(self, rank: int, need: Mapping[str, int]) -> dict[str, list[int]]:
        """Take `need[g]` new pages of every group g (one reference each), or raise and
        take none."""
        if not self.can_allocate(rank, need):
            raise RuntimeError(f"rank {rank} cannot supply {dict(need)}")
        return {g: [self._take(rank, g) for _ in range(n)] for g, n in need.items() if n}

    def _take(self, rank: int, group: str) -> int:
        plain, cached = self._plain[rank][group], self._cached[rank][group]
        if plain:
            page = plain.pop()
        else:
            page, _ = cached.popitem(last=False)        # least recently freed
            self._drop(rank, self._entry_of[rank][(group, page)])
            self.evictions[rank] += 1
        self._refs[rank][group][page] = 1
        return page

    def hold(self, rank: int, pages: Pages) -> None:
        """One more reference to each page (a cached free page stops being free)."""
        for g, ids in pages.items():
            for i in ids:
                if self._refs[rank][g][i] == 0:
                    del self._cached[rank][g][i]        # only cached pages are held again
                self._refs[rank][g][i] += 1

    def free(self, rank: int, pages: Pages) -> None:
        """One reference less to each page; a page left with none is free again (cached
        if it belongs to an entry). Ids are released last first, so that a request's
        early blocks, shared by more prompts, stay cached longest."""
        for g, ids in pages.items():
            for i in reversed(list(ids)):
                refs = self._refs[rank][g]
                if refs[i] <= 0:
                    raise RuntimeError(f"rank {rank} {g} page {i} freed more than held")
                refs[i] -= 1
                if refs[i] == 0:
                    if (g, i) in self._entry_of[rank]:
                        self._cached[rank][g][i] = None
                    else:
                        self._plain[rank][g].append(i)

    def refs(self, rank: int, group: str, page: int) -> int:
        return self._refs[rank][group][page]

    # -- prefix-cache entries ----------------------------------------------------------

    def put(self, rank: int, key: Hashable, pages: Mapping[str, int]) -> bool:
        """Make `pages` (one per group, each held now) the entry `key`; False if `key`
        is there already or a page belongs to another entry."""
        entry_of = self._entry_of[rank]
        if key in self._entries[rank] or any((g, i) in entry_of for g, i in pages.items()):
            return False
        self._entries[rank][key] = dict(pages)
        entry_of.update(((g, i), key) for g, i in pages.items())
        return True

    def get(self, rank: int, key: Hashable) -> dict[str, int] | None:
        return self._entries[rank].get(key)

    def cached_blocks(self, rank: int) -> int:
        """Entries on `rank`."""
        return len(self._entries[rank])

    def _drop(self, rank: int, key: Hashable) -> None:
        """Forget an entry; its free pages turn plain."""
        for g, i in self._entries[rank].pop(key).items():
            del self._entry_of[rank][(g, i)]
            if i in self._cached[rank][g]:
                del self._cached[rank][g][i]
                self._plain[rank][g].append(i)
