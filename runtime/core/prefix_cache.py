"""Prefix caching on the grouped pools: block keys, and where a block boundary's state
lives. Torch-free, I/O-free.

Block j of a request is its tokens [j*b, (j+1)*b) (b = block_size). Its key chains every
token before it: key_j = H(key_{j-1}, tokens[j*b : (j+1)*b + lookahead]). With MTP,
lookahead = 1: the MTP layer's key row at position (j+1)*b - 1 is built from the token
after it, so two prompts share block j only if they also share that token.

Block 0 chains from the request's cache_salt (SamplingParams; vLLM's field): from nothing
without one, else from a digest of the salt. So every key of a salted request differs from
those of every other salt and of unsalted requests, and a hit (what `cached_tokens`
reports) is only ever on entries its own salt made: a client cannot learn whether another
salt's prompts match its guesses.

An entry (key_j, on one rank) holds what a request continuing at boundary B = (j+1)*b
reads and does not compute:

    full groups   page j of the request that computed it: its compressed entries cover
                  exactly block j's tokens (tokens per page = b); shared, never written
                  again (later writes land on later pages)
    ring groups   a copy, taken when the computation stood at B, of the ring page
                  holding positions [B - span, B) (`boundary_span`): the sliding window
                  (ori: span window - 1, every layer and the MTP layer or DSpark stages)
                  and the rows an overlapping compressor pools again (V4's CSA state:
                  span ratio); a compressor without overlap (V4's HCA, every V4.1
                  state_c{r}) has nothing pending at B (span 0) and keeps no copy

A hit of J blocks holds the full pages of entries 0..J-1 and copies entry J-1's ring
pages into the new request's ring, at the ring entry position B - 1 maps to. So the new
request reads exactly the rows the first computed, and computes from B on.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from contract.model_args import ModelArgs
from runtime.core.request import Request


class Group(Protocol):
    layers: tuple[int, ...]
    policy: str
    rows_per_page: int
    tokens_per_row: int
    ring_pages: int | None


# Ring copies are the price of a cached block (a sliding-window page is a block's full,
# uncompressed KV): the pools keep copy pages for one block in COPY_SHARE of the history
# they hold, so that caching costs about twice the memory per token of history, not ten
# times, and the cache holds up to 1/COPY_SHARE of that history in prefixes.
COPY_SHARE = 8


class Unsupported(ValueError):
    """A spec whose pages do not line up with its blocks: no prefix caching."""


@dataclass(frozen=True)
class Layout:
    """Which groups an entry keeps, and where a boundary's rows sit in a ring."""

    block_size: int
    lookahead: int                       # tokens after a block its key covers
    full: tuple[str, ...]                # full groups: page j is block j
    ring: dict[str, tuple[int, int]]     # ring groups with state at a boundary:
    #                                      group -> (rows_per_page, ring_pages)
    reach: int                           # positions past B before a ring row of B is
    #                                      overwritten: how late a copy may be taken

    @classmethod
    def of(cls, groups: Mapping[str, Group], config: Mapping[str, Any], block_size: int,
           k: int) -> Layout:
        """The layout of a spec's pool groups and model config; Unsupported if its pages
        do not line up with blocks of `block_size`."""
        args = ModelArgs.from_config(config)
        full, ring, reach = [], {}, block_size
        for name, g in sorted(groups.items()):
            if g.policy == "full":
                if g.rows_per_page * g.tokens_per_row != block_size:
                    raise Unsupported(f"a {name} page covers {g.rows_per_page * g.tokens_per_row}"
                                      f" tokens, not one block of {block_size}")
                full.append(name)
                continue
            span = boundary_span(name, g, args, block_size)
            if span:
                rows = g.rows_per_page
                if span > rows or block_size % rows:
                    raise Unsupported(f"the {name} rows a block boundary needs do not sit on "
                                      "one ring page")
                ring[name] = (rows, g.ring_pages)
                reach = min(reach, rows * g.ring_pages - span)
        return cls(block_size, 1 if k else 0, tuple(full), ring, reach)

    @property
    def copies(self) -> dict[str, int]:
        """Ring groups that keep pages of cached blocks: group -> tokens of history per
        page (what runtime/planning/capacity.py sizes them by)."""
        return {g: self.block_size * COPY_SHARE for g in self.ring}

    def ring_entry(self, group: str, boundary: int) -> int:
        """The ring-table entry whose page holds the rows just before `boundary`."""
        rows, pages = self.ring[group]
        return (boundary // rows - 1) % pages

    def max_blocks(self, request: Request, upto: int) -> int:
        """Blocks whose keys the request's known tokens give, all ending at or before
        position `upto`."""
        known = (request.num_tokens - self.lookahead) // self.block_size
        return max(0, min(known, upto // self.block_size))

    def keys(self, request: Request, count: int) -> list[bytes]:
        """The request's first `count` block keys (computed once, kept on the request)."""
        keys, b = request.block_keys, self.block_size
        if len(keys) < count:
            for j in range(len(keys), count):
                h = hashlib.blake2b(keys[-1] if keys else _root(request), digest_size=16)
                end = min((j + 1) * b + self.lookahead, request.num_tokens)
                h.update(_pack(request.tokens(j * b, end)))
                keys.append(h.digest())
        return keys[:count]


WINDOW_GROUP = "ori"      # the ring of every layer's window, in both families' specs


def boundary_span(name: str, group: Group, args: ModelArgs, block_size: int) -> int:
    """Rows just before a block boundary B that ring group `name` holds and a request
    continuing at B reads: positions [B - span, B). The window group: window - 1. Any
    other ring group is its layers' compressor state: the whole groups an overlapping
    compressor pools again (overlap x ratio; V4's CSA: 4), nothing else, for the open
    group is empty at B when the ratio divides the block (else Unsupported)."""
    if name == WINDOW_GROUP:
        return args.window - 1
    shapes = {(args.ratio(layer), args.compressor_overlap(layer)) for layer in group.layers}
    if len(shapes) != 1 or 0 in {ratio for ratio, _ in shapes}:
        raise Unsupported(f"ring group {name} is neither the window ({WINDOW_GROUP}) nor the "
                          "state of compressors of one ratio")
    (ratio, overlap), = shapes
    if block_size % ratio:
        raise Unsupported(f"a block of {block_size} tokens ends inside a ratio-{ratio} "
                          f"compressor group of {name}")
    return overlap * ratio


def _root(request: Request) -> bytes:
    """What block 0's key chains from: nothing for an unsalted request, else a 16-byte
    digest of its salt (hashed in a domain of its own: no block key)."""
    salt = request.params.cache_salt
    if salt is None:
        return b""
    return hashlib.blake2b(salt.encode("utf-8"), digest_size=16,
                           person=b"v4serve-salt").digest()


def _pack(tokens: list[int]) -> bytes:
    return b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)


@dataclass
class CacheStats:
    """Prompt tokens looked up and found, per rank (vLLM's prefix_cache_queries/hits)."""

    queries: list[int]
    hits: list[int]

    @classmethod
    def zeros(cls, ranks: int) -> CacheStats:
        return cls([0] * ranks, [0] * ranks)

    def add(self, rank: int, queried: int, hit: int) -> None:
        self.queries[rank] += queried
        self.hits[rank] += hit
