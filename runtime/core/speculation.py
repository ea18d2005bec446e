"""Speculation: how many MTP drafts (K) a decode step runs. Torch-free, I/O-free.

    fixed     the K given at launch, every step (what vLLM and SGLang do)
    adaptive  per step, the K in 0..max that maximizes the expected tokens per second of
              the step's rows:

                  rate(K) = E(K) / cost(K, rows)
                  E(K)    = 1 + a1 + a1 a2 + ... + a1 a2 ... aK     tokens a row commits

              with aj the running acceptance of draft j among rows whose drafts 1..j-1
              were kept, and cost(K, rows) the measured seconds of a decode step of that K
              (per power-of-two bucket of the step's rows: the lower median of its last
              five measurements, so that a step slowed by something else - a first use,
              another process - does not decide the next hundred).

Every K is compiled ahead (the spec's decode layouts). A K=0 step is a plain one that
leaves the MTP slots where they were; the next fused step catches each slot up from the
host's tail and position (ModelRunner._catch_up), so a switch never recomputes. The
engine reports each step (`observe`): its K, rows and acceptance, and its seconds when
the step was decode only (a prefill's time says nothing of a layout's cost).

The adaptive choice explores: a (K, bucket) measured fewer than `warm` times (once) is
tried first, and every `probe_every` steps of a bucket the K measured longest ago there is
tried for two steps, so that a cost that changed (a context bucket, a busier machine) or
an acceptance that changed (other prompts) is seen again. At most two steps in
`probe_every` run a K not picked for its rate.

A caught-up slot keeps the streams of its last fused step, so the first fused step after
a K=0 one drafts from older streams: its acceptance is not counted (a probe's second step
is).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

POLICIES = ("fixed", "adaptive")


class Speculation:
    """The fixed policy: K = `k` every step."""

    name = "fixed"

    def __init__(self, k: int):
        self.k, self.ks = k, (k,)

    def choose(self, rows: int) -> int:
        """The K of a decode step of `rows` rows (all ranks)."""
        return self.k

    def observe(self, k: int, rows: int, seconds: float | None,
                reached: list[int], accepted: list[int]) -> None:
        """A decode step ran: K, its rows, its seconds (None: it also prefilled), and per
        draft position j the rows that reached it (drafts before it kept) and kept it."""


@dataclass
class _Cost:
    """The last measurements of one (K, bucket), and the step it was last measured."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    measured_at: int = 0

    @property
    def seconds(self) -> float:
        """The lower median of the samples kept."""
        return sorted(self.samples)[(len(self.samples) - 1) // 2]


@dataclass
class _Acceptance:
    """Running counts per draft position, decayed so that the last few hundred rows
    weigh most."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def rate(self, j: int, prior: float) -> float:
        """a_{j+1}: how often position j's draft is kept when reached; a position never
        reached takes `prior` (the previous position's rate)."""
        if j >= len(self.reached) or self.reached[j] < 1:
            return prior
        return self.accepted[j] / self.reached[j]

    def add(self, reached: list[int], accepted: list[int], decay: float) -> None:
        grow = len(reached) - len(self.reached)
        if grow > 0:
            self.reached += [0.0] * grow
            self.accepted += [0.0] * grow
        for j, (n, kept) in enumerate(zip(reached, accepted)):
            if n:
                self.reached[j] = self.reached[j] * decay ** n + n
                self.accepted[j] = self.accepted[j] * decay ** n + kept


class AdaptiveSpeculation(Speculation):
    """K chosen per step among 0..`max_k` (see the module docstring)."""

    name = "adaptive"
    DECAY = 0.999             # per row reaching a position: ~1000 rows of memory
    FIRST_RATE = 0.5          # the acceptance assumed before any draft was verified

    def __init__(self, max_k: int, probe_every: int = 48, warm: int = 1):
        super().__init__(max_k)
        self.ks = tuple(range(max_k + 1))
        self.probe_every, self.warm = probe_every, warm
        self.costs: dict[tuple[int, int], _Cost] = {}
        self.acceptance = _Acceptance()
        self._steps: dict[int, int] = {}           # decode steps per bucket
        self.chosen: dict[int, int] = {}           # steps per K (the metrics' histogram)
        self._again: int | None = None             # a probe's K, for its second step
        self._observed: int | None = None          # the K of the step observed last

    def choose(self, rows: int) -> int:
        bucket = _bucket(rows)
        step = self._steps[bucket] = self._steps.get(bucket, 0) + 1
        unmeasured = [k for k in self.ks if len(self._cost(k, bucket).samples) < self.warm]
        if self._again is not None:
            k, self._again = self._again, None
        elif unmeasured:
            k = unmeasured[0]
        elif step % self.probe_every == 0:
            k = self._again = min(self.ks, key=lambda k: self.costs[k, bucket].measured_at)
        else:
            k = max(self.ks, key=lambda k: self.expected_tokens(k)
                    / self.costs[k, bucket].seconds)
        self.chosen[k] = self.chosen.get(k, 0) + 1
        return k

    def expected_tokens(self, k: int) -> float:
        """E(K): the tokens a row commits in a step of K drafts, at the running rates."""
        total, reach, rate = 1.0, 1.0, self.FIRST_RATE
        for j in range(k):
            rate = self.acceptance.rate(j, rate)
            reach *= rate
            total += reach
        return total

    def observe(self, k: int, rows: int, seconds: float | None,
                reached: list[int], accepted: list[int]) -> None:
        if self._observed != 0 or not k:    # not the first fused step after a K=0 one
            self.acceptance.add(reached, accepted, self.DECAY)
        self._observed = k
        if seconds is None or rows <= 0:
            return
        bucket = _bucket(rows)
        cost = self._cost(k, bucket)
        cost.samples.append(seconds)
        cost.measured_at = self._steps.get(bucket, 0)

    def _cost(self, k: int, bucket: int) -> _Cost:
        if (k, bucket) not in self.costs:
            self.costs[k, bucket] = _Cost()
        return self.costs[k, bucket]


def _bucket(rows: int) -> int:
    """Rows 1, 2-3, 4-7, 8-15, ... share a cost estimate."""
    return max(rows, 1).bit_length()


def make(policy: str, k: int) -> Speculation:
    """The policy `policy` (one of POLICIES) over K up to `k`."""
    if policy == "adaptive" and k > 0:
        return AdaptiveSpeculation(k)
    return Speculation(k)
