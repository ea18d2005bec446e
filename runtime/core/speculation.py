"""Speculation: how many MTP drafts (K) a decode step runs. Torch-free, I/O-free.

    fixed     the K given at launch, every step (what vLLM and SGLang do)
    adaptive  per step, the K in 0..max that maximizes the expected tokens per second of
              the step's rows:

                  rate(K)  = (E_1(K) + ... + E_n(K)) / cost(K, n)
                  E_i(K)   = 1 + a_i1 + a_i1 a_i2 + ... + a_i1 ... a_iK

              E_i(K) is the tokens row i commits in a step of K drafts. a_ij is how often
              request i keeps draft j when it reaches it (drafts 1..j-1 kept): its own
              count (Request.acceptance), drawn toward the running rate of all requests
              by ROW_PRIOR rows, so that a request with no drafts yet takes the common
              rate. Requests differ (a file of repeated code drafts well, prose less),
              and a batch is not the average request: the requests that keep the fewest
              drafts are the ones still running at the end. ROW_PRIOR is 8 rows:
              enough that a batch's slowest row is not misread from its first draws
              (a drain follows the least of many estimates), few enough that a
              request that drafts worse than those before it is found out within its
              first dozen fused steps, not carried on a dear K for tens.

              While no request waits, a finished row's place stays empty and the
              batch lasts as long as its slowest row: the scheduler gives each row's
              tokens left (Scheduler._choose_k), and the K chosen is the one that, held
              to the end, ends the last row soonest. Row i ends after left_i / E_i(K)
              steps; each stretch between two rows' ends is priced at the rows still
              running, linear between the typical rows of the buckets measured (flat
              beyond them). With a cost flat in the rows this follows the row that
              would end last; with one that grows with the rows (many rows), ending
              the quick rows sooner makes the last one's steps cheaper, and it sees
              that once it has measured fewer rows (a batch drained before).

              cost(K, n) is the measured seconds of a decode step of that K, per
              power-of-two bucket of rows, at the machine's speed now (Drift): the
              median of its last five measurements (kept at one speed), so that a step
              slowed or sped by something else (a first use, another process, a
              moment idle) does not decide the next hundred: one probe's two steps
              do not move it alone, two probes do. Of an even count, the lower of
              the middle two: what else runs on a machine slows a step and never
              speeds it, so of two readings the lower is nearer the step's own cost.

Every K is compiled ahead (the spec's decode layouts), and a K=0 step runs one of two
kernels (`keep_slots`, set by each choice):

    plain   the plain layout's: the MTP slots stay where they were; the next step that
            drafts catches each slot up from the host's tail and position
            (ModelRunner._catch_up), its streams those of its last fused step, and the
            MTP layer's window keeps a hole over the plain steps
    twin    the plain layout's twin that keeps the slots (DECODE_KEEPING_SLOTS_BY_K):
            each row writes the window row a first draft would and its slot moves on,
            so the drafts after it are as good as after fused ones; it costs more (on
            the embedded model, 1.15x a plain step at one row, 1.1x at eight)

so a switch never recomputes. K=0 runs plain, as a probe among drafting steps too (two
steps: a two-row hole), except while it leads and a drafting step is due within WARM
steps (a probe, a confirmation, a K not yet measured in the bucket): the twin then fills the
window's last rows, and the drafting step waits for WARM of them, so that it drafts as a
drafting request would (after a long plain stretch with nothing whole, a probe read a
request's acceptance low and kept it on K=0). Four are enough: at eight rows of the
embedded model, a first draft after 36 plain steps and 4 twins is kept as often as one
after 40 twins or in a run of fused steps (70%), and 61% after plain steps alone.
K=0's cost is the plain kernel's: a twin step's seconds are not measured. A row's
first fused step after a plain one drafts from older streams: its drafts are not counted
(Acceptance.behind). The engine reports each decode step (`observe`): its K, rows, each
drafting row's drafts kept, and its seconds when the step was decode only (a prefill's
time says nothing of a layout's cost).

Exploration. Each K is measured once before any is chosen for its rate. A bucket of rows
not seen before starts from its neighbour's costs: a K not yet run in it costs what it
costs in the nearest bucket where it ran, times the ratio between the two buckets of the
nearest K run in both. It runs the K that is best by these, and measures the others once
it has lasted FRESH steps, so that the few steps of a bucket passed through as a batch
drains are not spent measuring; and no K but the best runs in a bucket before the best
has run three steps there within the last SPEED, SETTLE steps or more after the last
step that prefilled (its speed of now, see Drift and `_timed`). The first measurement
of each K is taken before that (the first steps, at any speed), so it counts as not run
until measured again at the speed of now: it may be a first use, or the step right after
a prefill (at one row of the embedded model 1.16x a steady step; the bench's warm-up
request gave K=0 such a step, and K=1 led the next request on it for 36 steps, to K=0's
first probe). A K that leads the bucket at the speed of now is measured at it: its
samples are the unit the bucket's other costs are measured in from then on (Drift), so
its first probe after it lost the lead adds to them and does not replace them (in a
per-step trace of the bench's one-row rounds, K=0's first probe after a hundred steps of
its lead replaced its samples, one slowed plain step then moved their mean, and K=1 was
held at 1.2x K=0's cost where it costs 1.6x: a drafting K led the next 300 steps). Then
a K not chosen is tried again, for two steps, once `probe_every` steps of the bucket
have passed since it was last run, so that a cost or an acceptance that changed is seen.
Each probe doubles that wait (up to MAX_WAIT times: costs go stale), and choosing the K
for its rate resets it; a K whose rate is more than SLACK below the best (twice SLACK
while it has one measurement) waits FAR times longer. So the probes of a long run cost
little: in a 256-step run where K=0 is best, K=1 13% behind and K=2 and 3 more than 20%,
K=1 is probed twice and K=2 and 3 once.

Batching. While K=0 leads, a stretch of drafting steps among plain ones costs more
than its steps: its WARM twins, and a first step of each kernel after another dearer
than its next. At one row of the embedded model (bench/switch_cost.py) the twins run
1.15-1.27x a steady plain step, a drafting K's first step 1.07-1.11x its second, the
first plain step after them 1.02-1.09x: a two-step probe costs 1.4-2.6 plain steps
beyond the tokens it commits (0.5-1% of a 256-step request), about one of them the
twins' and the switches'. So once a drafting step has run, the drafting probes due
within half their wait (and a drafting K's confirmation) run right after it, on the
slots it left warm, rather than each after twins of its own later.

Drift. A shared machine's speed changes by half over tens of steps, and a K not chosen
is measured only at its probes: a cost taken while the machine was slow, held against
one taken since it sped up, would keep the policy on a worse K until the next probe
(a hundred steps and more). So each bucket's costs are kept at one speed: the steps of
the K chosen for its rate add nothing to its cost but tell the bucket's speed, the median
of its last three steps' seconds over that cost; every other sample is divided by the
bucket's speed when it is taken, and every cost multiplied by the speed now. A probe's
cost is thus its seconds against the chosen K's steps around it in its bucket, and the
chosen K's own cost cancels out of every comparison at its bucket. The speed is the
bucket's own: a bucket's costs were measured at other moments than another's (the one
row of a drain's end, minutes after the last run of one row), and a sample divided by
another bucket's speed would be off by the machine's change between them (a K measured
at 1.25x a plain step's cost at one row, where it costs 2x, and chosen for the whole of
the next run).

Switches. The first plain step after drafting ones costs more than the plain steps
after it (the kernels switch): at one row of the embedded model 1.02-1.15x in a steady
run, up to 1.4x after a request's first drafting steps (bench/policy_costs.py
--samples). Taken as K=0's cost while a drafting K leads, one such step made K=1 lead at
1.33x K=0's cost where it costs 1.6x, for a hundred steps. So a plain step right after a
drafting one in its bucket is not a cost sample (the bucket's speed aside, the leader's
steps tell it), and a measurement of K=0 among drafting steps runs two steps: its probe
(as any probe), and its first measurement at the bucket's speed of now. A probe's second
step runs in the probe's bucket only: a step of another bucket in between drops it.

Confirmation. A K that displaced the one chosen before right after a probe (some cost
of the bucket measured since the last step of the one before) was chosen because its
probes measured well, maybe by chance (the machine idle for those steps): CONFIRM steps
on, the K it displaced is probed again, against the new one's steps since, rather than
at its next probe, up to 4x48 steps on. One that displaced it on the rows' acceptance
alone (a new request's own drafts, kept less than the common rate said) is not: no cost
changed, and the probe would cost two steps of the K just left for what is known.

Host work. Pricing a drain is the policy's dearest work (per K, every row's tokens left):
the rates serve REFRESH steps of the same rows while no cost is measured, as acceptance
and tokens left move little in a few steps and the machine's speed scales every K alike.
And while they serve, a leader chosen with nothing else due is held: when its previous
step was its own, the bucket's speed is of now, every K is measured at it and no
confirmation is pending, nothing but the leader's own steps can change the choice before
its next probe (a drafting leader) or its next drafting step's WARM twins (K=0), so the
steps up to then choose it without the rest; a prefill, another bucket or other rows end
the hold. A step's host work runs on caches its kernels have just cooled: at one row of
the embedded model choose() took 39-52 us a step with no hold (the median of a round;
12 us in a loop of choices alone), 11-12 us with it (means 49-62 and 35-39 us: the
steps the whole choice runs), beside a plain step of 5.5 ms (bench/policy_costs.py
--host).
"""
from __future__ import annotations

import operator
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

POLICIES = ("fixed", "adaptive")


@dataclass
class Acceptance:
    """Per draft position j: the rows that reached it (the drafts before it kept) and
    kept its draft, decayed so that recent rows weigh most. The policy keeps one for all
    requests; each request keeps its own (Request.acceptance)."""

    reached: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)
    # a request's: a plain K=0 step ran it last, so its MTP slot's streams are older
    # than its tail and its next first draft is kept less (not counted)
    behind: bool = False

    def rate(self, j: int, prior: float, weight: float = 0.0) -> float:
        """How often position j's draft is kept when reached, drawn toward `prior` by
        `weight` rows; a position never reached takes `prior`."""
        n = self.reached[j] if j < len(self.reached) else 0.0
        if n < 1 and not weight:
            return prior
        kept = self.kept[j] if n else 0.0
        return (kept + weight * prior) / (n + weight)

    def add(self, reached: Sequence[int], kept: Sequence[int], decay: float) -> None:
        """Rows that reached and kept each position (`decay` per row reaching it)."""
        self._grow(len(reached))
        for j, (n, k) in enumerate(zip(reached, kept)):
            if n:
                self.reached[j] = self.reached[j] * decay ** n + n
                self.kept[j] = self.kept[j] * decay ** n + k

    def add_row(self, k: int, accepted: int, decay: float) -> None:
        """One row's step of `k` drafts, `accepted` of them kept."""
        self._grow(k)
        for j in range(min(accepted + 1, k)):
            self.reached[j] = self.reached[j] * decay + 1
            self.kept[j] = self.kept[j] * decay + (j < accepted)

    def _grow(self, positions: int) -> None:
        if positions > len(self.reached):
            self.reached += [0.0] * (positions - len(self.reached))
            self.kept += [0.0] * (positions - len(self.kept))


class Speculation:
    """The fixed policy: K = `k` every step."""

    name = "fixed"
    keep_slots = True        # a K=0 step (of K chosen per step) runs the twin kernel

    def __init__(self, k: int):
        self.k, self.ks = k, (k,)

    def choose(self, rows: Sequence[Acceptance],
               left: Sequence[float] | None = None) -> int:
        """The K of a decode step of `rows` (each row's request acceptance, all ranks);
        given each row's tokens `left`, for the soonest end of the batch's last row
        instead of the most tokens per second."""
        return self.k

    def observe(self, k: int, rows: int, seconds: float | None,
                drafts: Sequence[tuple[Acceptance, int]], twin: bool = False) -> None:
        """A decode step ran: K, its rows, its seconds (None: it also prefilled), and for
        each row that drafted K tokens, its request's acceptance and the drafts kept (at
        K=0 every row, none drafted and none kept); `twin`: a K=0 step that kept the
        MTP slots."""

    def prefilled(self) -> None:
        """A step prefilled (before its decode, if it had one): the decode steps after it
        run on the caches it filled."""


@dataclass
class _Cost:
    """The last five measurements of one (K, bucket) at one machine speed, when it last
    ran and how long it waits to be probed."""

    wait: int
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    ran_at: int = 0
    timed: bool = False         # its samples taken while its bucket's speed was of now

    @property
    def seconds(self) -> float:
        return _median(self.samples)


@dataclass
class _Served:
    """The rates computed for these rows (the requests' own acceptance, held so that a
    finished request's is not mistaken for a new one's), and the steps they served."""

    rows: tuple[Acceptance, ...]
    drain: bool                       # priced for the batch's last row (left given)
    rates: dict[int, float]
    steps: int = 0
    # the leader it holds (see Host work): its bucket and the last bucket step held
    hold: tuple[int, int, int] | None = None

    def serves(self, rows: Sequence[Acceptance], drain: bool) -> bool:
        return drain == self.drain and len(rows) == len(self.rows) \
            and all(map(operator.is_, rows, self.rows))

    def holds(self, rows: Sequence[Acceptance], drain: bool, bucket: int,
              step: int) -> int | None:
        """The K held for this step of these rows, if any (counted as served)."""
        if self.hold is None or self.hold[1] != bucket or step > self.hold[2] \
                or not self.serves(rows, drain):
            return None
        self.steps += 1
        return self.hold[0]


class AdaptiveSpeculation(Speculation):
    """K chosen per step among 0..`max_k` (see the module docstring)."""

    name = "adaptive"
    DECAY = 0.999             # per row reaching a position: ~1000 rows of memory
    ROW_DECAY = 0.99          # a request's own: its last ~100 drafts per position
    ROW_PRIOR = 8.0           # rows of the common rate in a request's own
    COMMON_PRIOR = 4.0        # rows of the position before's rate in a deeper one's
    FIRST_RATE = 0.5          # the acceptance assumed before any draft was verified
    SLACK = 0.2               # a K this far below the best rate ...
    FAR = 4                   # ... waits this many times longer for its probe
    MAX_WAIT = 4              # a probe's wait doubles up to this many probe_every
    FRESH = 8                 # steps of a new bucket before the K not run in it run
    CONFIRM = 4               # steps after a change of the best before the old is probed
    REFRESH = 4               # steps a choice's rates serve (see _rates)
    WARM = 4                  # K=0 steps before a drafting one that keep the slots
    SPEED = 8                 # steps in which a bucket's best ran three for its speed
    SETTLE = 8                # steps after a prefill before another K than the best runs

    def __init__(self, max_k: int, probe_every: int = 48):
        super().__init__(max_k)
        self.ks = tuple(range(max_k + 1))
        self.probe_every = probe_every
        self.costs: dict[tuple[int, int], _Cost] = {}
        self._measured: set[int] = set()           # the K measured in some bucket
        self._rows: dict[int, deque[int]] = {}     # per bucket: its last steps' rows
        self.acceptance = Acceptance()
        self._steps: dict[int, int] = {}           # decode steps per bucket
        self.chosen: dict[int, int] = {}           # steps per K (the metrics' histogram)
        self._again: tuple[int, int] | None = None  # (K, bucket) of a probe's second step
        self._best: int | None = None              # the K chosen for its rate this step
        self._leader: dict[int, int] = {}          # per bucket: the K chosen for its rate
        self._confirming: dict[int, tuple[int, int]] = {}  # per bucket: (K, due step)
        self._speed: dict[int, deque[tuple[int, float]]] = {}  # per bucket: (step,
        #   its best's seconds / cost) of its best's last steps
        self._decoded = 0                          # timed decode steps, all buckets
        self._since_prefill = 0                    # timed steps since one that prefilled
        self._twins = 0                            # twin steps since the last other
        self._probed: set[int] = set()             # buckets measured since their leader ran
        self._observed: int | None = None          # the K of the step observed last
        self._drafted_in: int | None = None        # its bucket, if it drafted
        self._served: _Served | None = None        # the rates of the last computation

    def choose(self, rows: Sequence[Acceptance],
               left: Sequence[float] | None = None) -> int:
        bucket = _bucket(len(rows))
        step = self._steps[bucket] = self._steps.get(bucket, 0) + 1
        self.keep_slots = False
        served, again, self._again = self._served, self._again, None
        held = served.holds(rows, left is None, bucket, step) \
            if served is not None and again is None else None
        if held is not None:
            k = self._best = held
        else:
            k = self._choose(rows, left, bucket, step, again)
        self._cost(k, bucket).ran_at = step
        self.chosen[k] = self.chosen.get(k, 0) + 1
        return k

    def _choose(self, rows: Sequence[Acceptance], left: Sequence[float] | None,
                bucket: int, step: int, again: tuple[int, int] | None) -> int:
        """choose() when no hold serves: a probe's second step, a K never measured, or
        `_pick`; a leader chosen with nothing due soon is held (`_hold`)."""
        self._best = None
        if again is not None and again[1] == bucket:    # (another bucket's: dropped)
            return again[0]
        unmeasured = [k for k in self.ks if k not in self._measured]
        if unmeasured:
            return unmeasured[0]
        rates = self._rates(rows, left)
        k = self._pick(rates, bucket, step)
        if k == self._best == 0 and self._timed(bucket):
            drafting = self._drafting_in(rates, bucket, step)
            self.keep_slots = drafting <= self.WARM
            self._hold(k, bucket, step, step + drafting - self.WARM - 1)
        elif k == self._best and self._again is None:
            self._hold(k, bucket, step, self._due(rates, bucket) - 1)
        return k

    def _hold(self, k: int, bucket: int, step: int, until: int) -> None:
        """Hold the leader `k` through bucket step `until` and the rates' REFRESH steps,
        when nothing but its own steps can run until then: its previous step was its
        own, the bucket's speed is of now, every K is measured at it, and no
        confirmation is pending (see Host work)."""
        served = self._served
        if self._observed != k or self._twins or not self._timed(bucket) \
                or bucket in self._confirming or served is None \
                or any(not self._cost(j, bucket).timed for j in self.ks):
            return
        served.hold = k, bucket, min(until, step + self.REFRESH - served.steps)

    def _due(self, rates: dict[int, float], bucket: int) -> int:
        """The bucket step at which the first probe of a K other than the best falls due."""
        best = self._best
        return min(self._cost(k, bucket).ran_at + self._wait(k, bucket, rates, best)
                   for k in self.ks if k != best)

    def _pick(self, rates: dict[int, float], bucket: int, step: int) -> int:
        """The best K; or, once the bucket has lasted FRESH steps, a K not yet measured
        in it at its speed of now; or a K whose probe is due (the one with the best rate).
        Another K than the best runs only while the bucket's speed is of now (`_timed`)."""
        best = max(self.ks, key=rates.__getitem__)
        # a drafting K after K=0 waits for WARM twin steps before it (see keep_slots),
        # unless the step before drafted: then the slots are warm, and while K=0 leads
        # the drafting probes due soon run now, on them (see Batching)
        warm = not best and bool(self._observed)
        timed = self._timed(bucket) and (best or warm or self._twins >= self.WARM)
        fresh = [k for k in self.ks if k != best and not self._cost(k, bucket).timed]
        if fresh and step > self.FRESH and timed:
            k = max(fresh, key=rates.__getitem__)
            self._again = None if k else (k, bucket)  # plain: its first step is a switch
            return k
        confirm = self._confirm(best, bucket, step, warm) if timed else None
        if confirm is not None:
            self._again = confirm, bucket
            return confirm
        due = [k for k in self.ks if k != best and timed
               and step - self._cost(k, bucket).ran_at
               >= self._wait(k, bucket, rates, best, warm)]
        if not due:
            self._lead(best, bucket, step)
            self._cost(best, bucket).wait = self.probe_every
            self._best = best
            return best
        k = max(due, key=rates.__getitem__)
        self._again = k, bucket
        cost = self._cost(k, bucket)
        cost.wait = min(2 * cost.wait, self.MAX_WAIT * self.probe_every)
        return k

    def _drafting_in(self, rates: dict[int, float], bucket: int, step: int) -> int:
        """Steps of the bucket until a drafting K runs while K=0 leads: its probe, the
        confirmation of the K it displaced, or a K not yet measured in the bucket at its
        speed of now."""
        due = [self._cost(k, bucket).ran_at + self._wait(k, bucket, rates, 0) - step
               for k in self.ks if k]
        if any(not self._cost(k, bucket).timed for k in self.ks if k):
            due.append(self.FRESH + 1 - step)
        pending = self._confirming.get(bucket)
        if pending is not None and pending[0]:
            due.append(pending[1] - step)
        return min(due)

    def _lead(self, best: int, bucket: int, step: int) -> None:
        """`best` leads the bucket. One that displaced another may have done so by a
        chance measurement: the K it displaced is probed again CONFIRM steps on, against
        the new leader's steps around it; one that displaced it with no cost of the
        bucket measured since (on the rows' acceptance) is not confirmed."""
        leader = self._leader.get(bucket)
        if leader is not None and leader != best and bucket in self._probed:
            self._confirming[bucket] = (leader, step + self.CONFIRM)
        self._leader[bucket] = best
        self._probed.discard(bucket)

    def _confirm(self, best: int, bucket: int, step: int, warm: bool) -> int | None:
        """The displaced K, once its confirming probe is due (unless it leads again); a
        drafting one at once while the slots are `warm`."""
        pending = self._confirming.get(bucket)
        if pending is None or step < pending[1] and not (warm and pending[0]):
            return None
        del self._confirming[bucket]
        return None if pending[0] == best else pending[0]

    def _wait(self, k: int, bucket: int, rates: dict[int, float], best: int,
              warm: bool = False) -> int:
        """Steps of the bucket a K not chosen waits, since it last ran, for its probe:
        FAR times longer when it is more than SLACK behind the best (twice SLACK after one
        measurement: it may have been slowed by something else); on `warm` slots, half
        (see Batching)."""
        cost = self._cost(k, bucket)
        behind = 1 - rates[k] / rates[best]
        far = behind > self.SLACK * (1 if len(cost.samples) > 1 else 2)
        wait = cost.wait * (self.FAR if far else 1)
        return wait // 2 if warm else wait

    def _rates(self, rows: Sequence[Acceptance],
               left: Sequence[float] | None) -> dict[int, float]:
        """rates(rows, left), kept for REFRESH steps while the steps have the same rows
        and no cost is measured: a request's acceptance and tokens left move little in a
        few steps, and the machine's speed scales every K's rate alike. A request that
        joins (or another in a finished one's place) has its own acceptance: computed
        again."""
        served = self._served
        if served is None or not served.serves(rows, left is None) \
                or served.steps >= self.REFRESH:
            served = self._served = _Served(tuple(rows), left is None,
                                            self.rates(rows, left))
        served.steps += 1
        return served.rates

    def rates(self, rows: Sequence[Acceptance],
              left: Sequence[float] | None = None) -> dict[int, float]:
        """Per K (all measured): the expected tokens per second of a step of `rows`; or,
        given each row's tokens `left`, of the batch until its last row ends (`_drain`)."""
        rates = self._common()
        common = self._expected(None, rates)
        expected = [self._expected(row, rates) if row.reached else common for row in rows]
        if left is not None:
            typical = self._typical(len(rows))
            return {k: sum(left) / self._drain(k, expected, left, typical) for k in self.ks}
        bucket = _bucket(len(rows))
        return {k: sum(e[k] for e in expected) / self._seconds(k, bucket) for k in self.ks}

    def _drain(self, k: int, expected: list[list[float]], left: Sequence[float],
               typical: list[tuple[int, int]]) -> float:
        """The seconds until the last row ends with K held to the end: row i ends after
        left_i / E_i(K) steps, and each stretch between two rows' ends is priced at the
        rows still running (`_at`, between the `typical` buckets' costs). With a cost
        flat in the rows, this is the steps of the row that would end last."""
        ends = sorted(n / e[k] for e, n in zip(expected, left))
        points = [(rows, self._seconds(k, bucket)) for bucket, rows in typical]
        seconds = done = 0.0
        for i, end in enumerate(ends):
            seconds += (end - done) * _at(points, len(ends) - i)
            done = end
        return seconds

    def _typical(self, rows: int) -> list[tuple[int, int]]:
        """(bucket, typical rows) of each bucket where some K ran, the typical rows the
        median of its last steps', up to the first bucket of at least `rows` (a drain
        from `rows` rows is priced at no more)."""
        out = []
        for bucket, last in sorted(self._rows.items()):
            out.append((bucket, sorted(last)[len(last) // 2]))
            if out[-1][1] >= rows:
                break
        return out

    def cost(self, k: int, rows: int) -> float:
        """The seconds the policy holds for a step of K at `rows` rows, at the machine's
        speed now (measured, or borrowed from the nearest bucket: `_normal`)."""
        return self._seconds(k, _bucket(rows))

    def _seconds(self, k: int, bucket: int) -> float:
        """cost(K, bucket) at the machine's speed now (see Drift in the module docstring)."""
        return self._normal(k, bucket) * self._now(bucket)

    def _normal(self, k: int, bucket: int) -> float:
        """cost(K, bucket) at the speed its samples are kept at: measured, or borrowed
        from the nearest bucket where K ran, scaled by the nearest K run in both (see
        Exploration in the module docstring)."""
        own = self._cost(k, bucket)
        if own.samples:
            return own.seconds
        near = min((b for (j, b), c in self.costs.items() if j == k and c.samples),
                   key=lambda b: (abs(b - bucket), b))
        both = [j for j in self.ks if self._cost(j, bucket).samples
                and self._cost(j, near).samples]
        if not both:      # near's seconds now, in the bucket's units
            return self.costs[k, near].seconds * self._now(near) / self._now(bucket)
        r = min(both, key=lambda j: abs(j - k))
        return self.costs[k, near].seconds * self.costs[r, bucket].seconds \
            / self.costs[r, near].seconds

    def _now(self, bucket: int) -> float:
        """How much slower the bucket's steps run now than when its costs were measured."""
        speed = self._speed.get(bucket)
        return _median([s for _, s in speed]) if speed else 1.0

    def _timed(self, bucket: int) -> bool:
        """Whether the bucket's speed is of now: its best ran three of the last SPEED
        decode steps, all since the last step that prefilled, and SETTLE or more steps
        ran since that one. A bucket come back to, or passed through in a drain, waits
        for them before it measures another K (its speed is of minutes ago, another
        bucket's is not its own); so does a batch just prefilled: a request's first
        decode steps are not its steady ones (bench/first_steps.py: at one row of the
        embedded model K=0's first 1.16x a steady one, its next two 0.90x). A probe
        priced against them, or against another bucket's speed, can come out far off:
        K=2 at one row at 1.25x a plain step's cost, where it is 2x, ran whole requests."""
        speed = self._speed.get(bucket)
        since = min(self._since_prefill, self.SPEED)
        return self._since_prefill >= self.SETTLE and bool(speed) \
            and len(speed) == speed.maxlen and speed[0][0] > self._decoded - since

    def expected_tokens(self, k: int) -> float:
        """E(K): the tokens a request without drafts of its own commits in a step of K
        drafts, at the common running rates."""
        return self._expected(None)[k]

    def _expected(self, row: Acceptance | None,
                  common: Sequence[float] | None = None) -> list[float]:
        """E(0), ..., E(max): a row's tokens per step of each K (None: the common row),
        given the `common` rate at each position (`_common()`, computed once a step).
        A request that keeps fewer (more) drafts than the common rate at one position
        keeps fewer (more) at the next: its prior at position j is the common rate
        there times its own over the common at j-1 (at most 1)."""
        out, reach, ratio = [1.0], 1.0, 1.0
        for j, c in enumerate(self._common() if common is None else common):
            rate = c if row is None else row.rate(j, min(1.0, c * ratio), self.ROW_PRIOR)
            ratio = rate / c if c else 1.0
            reach *= rate
            out.append(out[-1] + reach)
        return out

    def _common(self) -> list[float]:
        """The common rate at each draft position, drawn toward the position before's
        rate (the first toward FIRST_RATE) by COMMON_PRIOR rows, lest its first row or
        two (all kept, or none) decide whether a K pays: at 1 row a draft or two is all
        the first steps see, and a deeper position is reached only by rows that kept
        every draft before it, so its count grows slowly."""
        out, rate = [], self.FIRST_RATE
        for j in range(self.k):
            rate = self.acceptance.rate(j, rate, self.COMMON_PRIOR)
            out.append(rate)
        return out

    def observe(self, k: int, rows: int, seconds: float | None,
                drafts: Sequence[tuple[Acceptance, int]], twin: bool = False) -> None:
        self._count(k, drafts, twin)
        bucket = _bucket(rows)
        # a plain step right after a drafting one of its bucket (see Switches)
        switch = not k and self._drafted_in == bucket
        self._drafted_in = bucket if k else None
        self._observed = k
        self._twins = self._twins + 1 if twin else 0
        if seconds is None or rows <= 0 or twin:
            return
        cost = self._cost(k, bucket)
        timed = self._timed(bucket)             # as when the step was chosen
        self._decoded += 1
        self._since_prefill += 1
        if bucket not in self._rows:
            self._rows[bucket] = deque(maxlen=9)
        self._rows[bucket].append(rows)
        self._measured.add(k)
        if switch:          # dearer than the plain steps after it
            return
        if k == self._best and cost.samples:
            # the bucket's unit: the costs measured from now on are in its samples' terms
            cost.timed |= timed
            if bucket not in self._speed:
                self._speed[bucket] = deque(maxlen=3)
            self._speed[bucket].append((self._decoded, seconds / cost.seconds))
        else:
            if timed and not cost.timed:        # the first at the speed of now replaces
                cost.samples.clear()            # those taken before it
            cost.timed |= timed
            cost.samples.append(seconds / self._now(bucket))
            self._probed.add(bucket)
            self._served = None

    def prefilled(self) -> None:
        self._since_prefill = 0
        if self._served is not None:        # the bucket's speed is not of now
            self._served.hold = None

    def _count(self, k: int, drafts: Sequence[tuple[Acceptance, int]], twin: bool) -> None:
        """Each row's drafts kept into its own acceptance and the common one (a K=0
        step's rows drafted none: a plain one leaves them behind, the twin brings them
        level); a row behind is not counted (its drafts came from older streams)."""
        if not k:
            for row, _ in drafts:
                row.behind = not twin
            return
        reached, kept = [0] * k, [0] * k
        for row, accepted in drafts:
            if row.behind:
                row.behind = False
                continue
            row.add_row(k, accepted, self.ROW_DECAY)
            for j in range(min(accepted + 1, k)):
                reached[j] += 1
            for j in range(accepted):
                kept[j] += 1
        self.acceptance.add(reached, kept, self.DECAY)

    def _cost(self, k: int, bucket: int) -> _Cost:
        if (k, bucket) not in self.costs:
            self.costs[k, bucket] = _Cost(self.probe_every)
        return self.costs[k, bucket]


def _median(values: Sequence[float]) -> float:
    """The middle value; of an even count the lower middle (see cost(K, n) above)."""
    return sorted(values)[(len(values) - 1) // 2]


def _at(points: list[tuple[float, float]], rows: int) -> float:
    """The seconds of a step of `rows` rows, linear between the (rows, seconds) points
    around it; beyond the first or last, that point's."""
    lower = points[0]
    for upper in points:
        if rows <= upper[0]:
            if upper[0] == lower[0]:
                return upper[1]
            return lower[1] + (upper[1] - lower[1]) * (rows - lower[0]) / (upper[0] - lower[0])
        lower = upper
    return lower[1]


def _bucket(rows: int) -> int:
    """Rows 1, 2-3, 4-7, 8-15, ... share a cost estimate."""
    return max(rows, 1).bit_length()


def step_ks(policy: str, k: int, layouts: Collection[int]) -> tuple[int, ...]:
    """The K a decode step may run under `policy` with at most `k` drafts, given the K of
    the spec's decode layouts: adaptive every K up to k; fixed k, and for the last tokens
    before max_model_len (where the scheduler caps a step's drafts at 1 .. k - 1) the
    largest layout at or below each cap."""
    if policy == "adaptive" and k:
        return tuple(range(k + 1))
    caps = {max(j for j in layouts if j <= cap) for cap in range(1, k)}
    return tuple(sorted(caps | {k}))


def make(policy: str, k: int) -> Speculation:
    """The policy `policy` (one of POLICIES) over K up to `k`."""
    if policy == "adaptive" and k > 0:
        return AdaptiveSpeculation(k)
    return Speculation(k)
