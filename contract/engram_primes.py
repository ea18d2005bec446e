"""The primes that size DeepSeek V4.1's Engram tables, from the config alone.

Each Engram layer hashes every n-gram (n = 2..max_ngram) once per head into its own
segment of the layer's table, of a prime number of rows. The primes are handed out in
config order over (layer, n, head): for each (layer, n) the search restarts just above
engram_vocab_size - 1, and each head takes the smallest prime above the previous head's
that no segment has taken yet, so no prime repeats across heads, n-grams or layers.
A layer's table has the sum of its primes as rows (engram_num_embeddings); segment
(n, h) sits at column c = (n - 2) * heads + h and starts at the sum of the primes before
it. Torch-free.
"""
from __future__ import annotations


def engram_primes(vocab_size: int, heads: int, max_ngram: int,
                  layers: int) -> list[list[int]]:
    """Per Engram layer, its (max_ngram - 1) * heads primes, n-major, head-minor."""
    seen: set[int] = set()
    out = []
    for _ in range(layers):
        primes = []
        for _n in range(2, max_ngram + 1):
            p = vocab_size - 1
            for _h in range(heads):
                p = _next_prime(p, seen)
                seen.add(p)
                primes.append(p)
        out.append(primes)
    return out


def engram_rows(vocab_size: int, heads: int, max_ngram: int, layers: int) -> list[int]:
    """Table rows of each Engram layer: the sum of its primes."""
    return [sum(p) for p in engram_primes(vocab_size, heads, max_ngram, layers)]


def _next_prime(after: int, taken: set[int]) -> int:
    n = after + 1
    while n in taken or not _is_prime(n):
        n += 1
    return n


def _is_prime(n: int) -> bool:
    """Trial division: the search runs near engram_vocab_size (16M released), a few
    hundred candidates of a few thousand divisions each."""
    if n < 4:
        return n > 1
    if n % 2 == 0 or n % 3 == 0:
        return False
    f = 5
    while f * f <= n:
        if n % f == 0 or n % (f + 2) == 0:
            return False
        f += 6
    return True
