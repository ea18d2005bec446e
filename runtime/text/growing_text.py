"""GrowingText: append-only text whose snapshots cost O(1), however long it grows.

    chunks: ["<CHUNK or more chars>", "<CHUNK or more>", ...]   frozen, only appended to
    tail:   "<fewer than CHUNK chars>"                          replaced on each append

An append copies the tail and the new piece, never the text before the tail, so growing a
text by a piece costs O(piece + CHUNK) whatever its length. A snapshot is (the chunk list,
how many chunks, the tail string): later appends add chunks past its count and replace
the tail with a new string, so it keeps its value; it is joined only when read.
"""
from __future__ import annotations

CHUNK = 1024     # characters: the tail an append copies stays below this


class TextSnapshot:
    """A GrowingText's value at one moment; joined (once) on first read: str(snapshot)."""

    __slots__ = ("_chunks", "_count", "_tail", "_length", "_text")

    def __init__(self, chunks: list[str], count: int, tail: str, length: int):
        self._chunks, self._count, self._tail, self._length = chunks, count, tail, length
        self._text: str | None = None if count else tail

    def __str__(self) -> str:
        if self._text is None:
            self._text = "".join([*self._chunks[:self._count], self._tail])
        return self._text

    def __len__(self) -> int:
        return self._length

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextSnapshot | str):
            return str(self) == str(other)
        return NotImplemented

    __hash__ = None         # equal to a str, so no hash of its own

    def __repr__(self) -> str:
        return repr(str(self))


EMPTY = TextSnapshot([], 0, "", 0)


class GrowingText:
    """Text that is only ever appended to (a request's released text, a choice's)."""

    __slots__ = ("_chunks", "_tail", "_length")

    def __init__(self) -> None:
        self._chunks: list[str] = []     # append-only: snapshots index into it
        self._tail = ""
        self._length = 0

    def append(self, piece: str) -> None:
        if not piece:
            return
        self._tail += piece
        self._length += len(piece)
        if len(self._tail) >= CHUNK:
            self._chunks.append(self._tail)
            self._tail = ""

    def snapshot(self) -> TextSnapshot:
        return TextSnapshot(self._chunks, len(self._chunks), self._tail, self._length)

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return str(self.snapshot())
