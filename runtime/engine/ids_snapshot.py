"""IdsSnapshot: the first n ids of an append-only list, as a read-only Sequence.

A RequestOutput's `output_ids`: taking one costs O(1) rather than a copy of every id so
far, and it keeps its value while the list under it grows (that list's owner, the
OutputProcessor, only ever appends to it). It reads as a list does: len, indexing, slices
(a slice is a new list), iteration, == against lists, tuples and other snapshots, + with
a list (a list). `list(snapshot)` where a real list is needed, as for a JSON encoder.
"""
from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import islice


class IdsSnapshot(Sequence[int]):
    __slots__ = ("_ids", "_length")

    def __init__(self, ids: list[int], length: int | None = None):
        self._ids = ids                   # append-only; only [:length] is ours
        self._length = len(ids) if length is None else length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step == 1:
                return self._ids[start:max(start, stop)]
            return [self._ids[i] for i in range(start, stop, step)]
        index = operator.index(index)
        if not -self._length <= index < self._length:
            raise IndexError("IdsSnapshot index out of range")
        return self._ids[index if index >= 0 else index + self._length]

    def __iter__(self) -> Iterator[int]:
        return islice(self._ids, self._length)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdsSnapshot | list | tuple):
            return NotImplemented
        return len(other) == self._length and \
            self._ids[:self._length] == (other if isinstance(other, list) else list(other))

    __hash__ = None         # equal to a list, and as unhashable

    def __add__(self, other: object) -> list[int]:
        if not isinstance(other, IdsSnapshot | list):
            return NotImplemented
        return [*self, *other]

    def __radd__(self, other: object) -> list[int]:
        if not isinstance(other, list):
            return NotImplemented
        return [*other, *self]

    def __repr__(self) -> str:
        return repr(self._ids[:self._length])
