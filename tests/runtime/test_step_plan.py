"""The step plan between the engine and its rank workers: a PlanWriter's bytes read back by
PlanReaders rebuild every step of a real scheduler field by field (whole, and each rank's
share), under preemption, prefix-cache hits and saves, MTP reservations, aborts and a
request id reused; a steady decode row costs the same few bytes whatever its context,
and a prompt travels once; results and a request's failure come back typed; and nothing
under runtime/ pickles."""
from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter

import msgspec
import pytest

from runtime.core.block_pool import BlockPool
from runtime.core.cache_manager import PageCopy
from runtime.core.mtp_slots import SlotTable
from runtime.core.prefix_cache import Layout
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import PrefillChunk, Scheduler, SchedulerConfig, SchedulerOutput
from runtime.core.speculation import Speculation
from runtime.device.step_result import SamplingFailure, StepResult, TokenLogprobs
from runtime.executor.plan_messages import Failure, Result, rebuilt, result_message, step_result
from runtime.executor.step_plan import PlanReader, PlanWriter
from runtime.text.grammar import GrammarError, StructuredOutputs
from tests.conftest import REPO

_arrival = itertools.count()
BLOCKS4 = {"kv": lambda n: -(-n // 4), "ring": lambda n: min(2, -(-n // 4))}
TOY = Layout(block_size=4, lookahead=0, full=("kv",), ring={"ring": (4, 2)}, reach=4)
PARAMS = [SamplingParams(max_tokens=9), SamplingParams(temperature=0.5, seed=3, logprobs=2),
          SamplingParams(max_tokens=5, stop_token_ids=(11,), logit_bias=((4, -2.5),),
                         structured=StructuredOutputs(regex="a+"))]


def _scheduler(ranks: int, kv: int, ring: int, k: int = 0, layout: Layout | None = None,
               extent: int = 8, budget: int = 16, formulas=BLOCKS4,
               adaptive: bool = False) -> Scheduler:
    config = SchedulerConfig(ranks=ranks, prefill_slots=2, decode_batch=2, micro_batches=2,
                             k=k, effective_extent=extent, max_num_batched_tokens=budget,
                             max_num_seqs=8, max_model_len=1 << 20,
                             batches=(2,) + (1,) * k if adaptive else ())
    return Scheduler(config, BlockPool({"kv": kv, "ring": ring}, ranks), formulas,
                     SlotTable(ranks, 4), layout,
                     _Cycling(k) if adaptive else None)


class _Cycling(Speculation):
    """K = 0, 1, ..., k, 0, ... step after step; K=0 with the MTP slots kept every other
    time."""

    def __init__(self, k: int):
        super().__init__(k)
        self.steps = itertools.count()

    def choose(self, rows, left=None) -> int:
        step = next(self.steps)
        self.keep_slots = step // (self.k + 1) % 2 == 0
        return step % (self.k + 1)


def _request(prompt: list[int], params: SamplingParams, rid: str | None = None) -> Request:
    arrival = next(_arrival)
    return Request(rid or f"r{arrival}", prompt, params, arrival, eos_token_id=2)


def _tokens(out: SchedulerOutput, step: int, k: int) -> dict[Request, list[int]]:
    """What a model returns: a token per decode row (two, every other step, with MTP)
    and per terminal chunk of a fresh prompt; never EOS or a stop token."""
    rows = [r for launch in out.decode for r in launch]
    got = {r: [20 + (step + i) % 50] * (1 + (k > 0 and (step + i) % 2))
           for i, r in enumerate(rows)}
    got.update({ch.request: [30] for ch in out.prefill
                if ch.terminal and not ch.request.output_ids})
    return got


# -- the rebuilt output, as plain data -----------------------------------------------------

def _row(r: Request, rank) -> tuple:
    return (r.request_id, r.prompt_ids, r.output_ids, r.params, r.eos_token_id, r.arrival,
            rank(r.rank), r.slot, r.slot_generation, r.blocks, r.num_computed)


def _copies(copies: list[PageCopy], here, local) -> list[tuple]:
    return [(local(c.rank), c.group, c.src, c.dst) for c in copies if here(c.rank)]


def _view(out: SchedulerOutput, rank: int | None = None, mirrored: bool = False) -> dict:
    """The runner's input as plain data: the whole step, or rank `rank`'s share with its
    requests' rank made 0 (`mirrored`: the ranks' own numbering already)."""
    here = (lambda g: True) if rank is None else (lambda g: g == rank)
    local = (lambda g: g) if rank is None else (lambda g: 0)
    row_rank = (lambda g: g) if mirrored else local
    mine = (lambda r: True) if mirrored else (lambda r: here(r.rank))

    def saves(ss):
        return [(s.request.request_id, local(s.rank), s.boundary,
                 _copies(s.copies, here, local), s.pages) for s in ss if here(s.rank)]
    return dict(
        decode=[[_row(r, row_rank) for r in launch if mine(r)] for launch in out.decode],
        k=out.k, keep_slots=out.keep_slots,
        prefill=[(_row(ch.request, row_rank), ch.slot, ch.start, ch.length, ch.terminal)
                 for ch in out.prefill if mine(ch.request)],
        launches=[[(p.request.request_id, p.start, p.length) for p in launch]
                  for launch in SchedulerOutput(
                      prefill=[ch for ch in out.prefill if mine(ch.request)],
                      snapshots=[s for s in out.snapshots if here(s.rank)]).prefill_launches()],
        fresh_blocks={(local(g), group): ids for (g, group), ids in out.fresh_blocks.items()
                      if here(g)},
        fresh_slots=[_row(r, row_rank) for r in out.fresh_slots if mine(r)],
        saves=saves(out.saves), restores=_copies(out.restores, here, local),
        snapshots=saves(out.snapshots))


class _Run:
    """A scheduler stepped with the model's tokens, each step written once and read by a
    whole reader and one reader per rank; the engine's forgetting emulated."""

    def __init__(self, sched: Scheduler, k: int = 0):
        self.sched, self.k = sched, k
        self.writer, self.whole = PlanWriter(), PlanReader()
        self.ranks = [PlanReader(r) for r in range(sched.config.ranks)]
        self.live: list[Request] = []
        self.forget: list[str] = []
        self.mirror: dict[Request, Request] = {}        # engine request -> its mirror
        self.lists: dict[Request, tuple] = {}           # its and the mirror's blocks lists
        self.sizes: list[int] = []
        self.steps = 0
        self.seen: Counter[str] = Counter()           # what the steps held

    def add(self, request: Request) -> Request:
        self.sched.add(request)
        self.live.append(request)
        return request

    def abort(self, request: Request) -> None:
        """As the engine does: finished in the scheduler, forgotten at once."""
        self.sched.finish(request, "abort")
        self.forget.append(request.request_id)
        self.live.remove(request)

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        extents = [self.steps, len(out.prefill)]
        self._count(out)
        data = self.writer.write(out, extents, self.forget)
        self.sizes.append(len(data))
        whole = self.whole.read(data)
        assert _view(whole.out, mirrored=True) == _view(out)
        assert whole.extents == extents and whole.forget == self.forget
        for rank, reader in enumerate(self.ranks):
            share = reader.read(data)
            assert _view(share.out, mirrored=True) == _view(out, rank), f"rank {rank}"
            assert share.forget == self.forget
        self._check_identity(out, whole.out)
        self.sched.commit(out, _tokens(out, self.steps, self.k))
        self.steps += 1
        self.forget = [r.request_id for r in self.live if r.finished]     # as _end does
        self.live = [r for r in self.live if not r.finished]
        return out

    def _count(self, out: SchedulerOutput) -> None:
        self.seen.update(restores=len(out.restores), snapshots=len(out.snapshots),
                         fresh_slots=len(out.fresh_slots),
                         preempted=len(out.preempted),
                         readmitted=sum(r.num_preemptions > 0 for r in out.fresh_slots),
                         forgotten_saves=sum(s.request.request_id in self.forget
                                             for s in out.saves))

    def _check_identity(self, out: SchedulerOutput, got: SchedulerOutput) -> None:
        """One mirror per request while it lives; a snapshot's request is its chunk's;
        a mirror's block lists are replaced exactly when the engine's are."""
        chunks = {id(ch.request) for ch in got.prefill}
        assert all(id(s.request) in chunks for s in got.snapshots)
        pairs = [(r, m) for launch, mine in zip(out.decode, got.decode)
                 for r, m in zip(launch, mine)]
        pairs += [(ch.request, mine.request) for ch, mine in zip(out.prefill, got.prefill)]
        for r, m in pairs:
            assert self.mirror.setdefault(r, m) is m
            now = (r.blocks, m.blocks, {g: (r.blocks[g], m.blocks[g]) for g in r.blocks})
            before = self.lists.get(r)
            if before is not None:
                assert (now[0] is before[0]) == (now[1] is before[1])
                for g, (ours, theirs) in now[2].items():
                    old = before[2].get(g, (None, None))
                    assert (ours is old[0]) == (theirs is old[1]), g
            self.lists[r] = now

    def drain(self, limit: int = 400) -> None:
        """Step until no work is left, then send the last forgets (as the engine's next
        step would): no mirror is left on any rank."""
        for _ in range(limit):
            if not self.sched.has_work():
                data = self.writer.write(SchedulerOutput(), [], self.forget)
                for reader in [self.whole, *self.ranks]:
                    assert reader.read(data).forget == self.forget
                    assert reader.mirrors() == []
                return
            self.step()
        raise AssertionError(f"still working after {limit} steps")


def _prompt(n: int, seed: int) -> list[int]:
    return [100 + (seed * 7919 + i * 104729) % 90000 for i in range(n)]


def test_every_step_under_preemption_and_mtp_is_rebuilt_field_by_field():
    run = _Run(_scheduler(ranks=2, kv=14, ring=8, k=1), k=1)
    for i, n in enumerate((3, 9, 17, 5, 12, 30, 2, 8)):
        run.add(_request(_prompt(n, i), PARAMS[i % 3]))
    for _ in range(6):
        run.step()
    run.abort(run.live[3])
    run.drain()
    assert run.seen["preempted"] and run.seen["readmitted"]


def test_each_steps_k_reaches_the_ranks_with_its_launches():
    """Steps of K = 0..3 in turn: the ranks read each step's K (and at K=0 which kernel
    runs), and its launches cut to that K's batch (2 rows a rank for K=0, 1 for the
    others)."""
    run = _Run(_scheduler(ranks=2, kv=40, ring=16, k=3, adaptive=True), k=1)
    for i, n in enumerate((3, 9, 5, 6, 4, 7)):
        run.add(_request(_prompt(n, i), PARAMS[0]))
    steps = [out for out in (run.step() for _ in range(20)) if out.decode]
    assert sorted({out.k for out in steps}) == [0, 1, 2, 3]
    assert {out.keep_slots for out in steps if out.k == 0} == {True, False}
    assert all(len(launch) <= 2 * (2 if out.k == 0 else 1) for out in steps
               for launch in out.decode)
    assert any(len(launch) == 4 for out in steps for launch in out.decode)
    run.drain()


def test_prefix_hits_saves_and_ended_requests_saves_are_rebuilt():
    """Prompts sharing a prefix on a toy layout: hits (restores, pins), snapshots inside
    chunks, decode saves, and the saves of requests that ended or were preempted the
    step before (their request may be forgotten in the same plan)."""
    run = _Run(_scheduler(ranks=2, kv=8, ring=6, layout=TOY, budget=12))
    shared = _prompt(13, 0)
    for i in range(10):
        run.add(_request(shared[: 5 + i] + _prompt(1 + i % 4, i + 1),
                         SamplingParams(max_tokens=4 + i % 5)))
        run.step()
    run.drain()
    assert run.sched.cache_stats.hits and run.sched.num_preemptions > 0
    assert all(run.seen[what] for what in ("restores", "snapshots", "forgotten_saves",
                                           "readmitted"))


def test_a_reused_request_id_is_a_new_request_to_the_ranks():
    run = _Run(_scheduler(ranks=1, kv=32, ring=8))
    first = run.add(_request(_prompt(6, 1), SamplingParams(max_tokens=2), rid="same"))
    while not first.finished:
        run.step()
    assert run.forget == ["same"]
    again = run.add(_request(_prompt(3, 2), SamplingParams(max_tokens=3), rid="same"))
    run.step()                            # forgets the first, introduces the second
    (mirror,) = run.whole.mirrors()
    assert mirror.prompt_ids == again.prompt_ids
    assert run.writer.request(run.whole.handle(mirror)) is again
    run.drain()


def test_a_ranks_share_renumbers_its_own_copies_only():
    a, b, c = (Request(rid, [5, 6, 7], SamplingParams(), 0, rank=rank, slot=1,
                       blocks={"ori": [1]}) for rid, rank in (("a", 0), ("b", 3), ("c", 3)))
    out = SchedulerOutput(decode=[[a, b], [a]], prefill=[PrefillChunk(c, 2, 0, 3)],
                          fresh_blocks={(3, "ori"): [4], (0, "ori"): [1]}, fresh_slots=[c])
    data = PlanWriter().write(out, [128], [])
    mine = PlanReader(3).read(data).out
    assert [[r.request_id for r in launch] for launch in mine.decode] == [["b"], []]
    assert [(ch.request.request_id, ch.slot, ch.request.rank) for ch in mine.prefill] \
        == [("c", 2, 0)]
    assert mine.fresh_blocks == {(0, "ori"): [4]}
    assert [r.request_id for r in mine.fresh_slots] == ["c"] and mine.fresh_slots[0].rank == 0
    assert (a.rank, b.rank, c.rank) == (0, 3, 3)              # the engine's: untouched
    assert PlanReader(2).read(data).out.decode == [[], []]


# -- bytes ---------------------------------------------------------------------------------

def _decode_sizes(prompt_len: int, rows: int = 8, steps: int = 60) -> tuple[list[int], int]:
    """The bytes of each plan of `rows` requests of `prompt_len` tokens decoding (blocks
    of 128 tokens), after their prefill; and the bytes of every plan before."""
    most = 4 * steps                      # the first to decode, while others prefill
    per = -(-(prompt_len + most + 1) // 128) * rows
    sched = _scheduler(ranks=2, kv=per, ring=2 * rows, extent=8192, budget=1 << 20,
                       formulas={"kv": lambda n: -(-n // 128), "ring": lambda n: 1})
    run = _Run(sched)
    run.ranks = []                        # the whole reader checks every step
    for i in range(rows):
        run.add(_request(_prompt(prompt_len, i), SamplingParams(max_tokens=most)))
    while any(r.prefilling or not r.output_ids for r in run.live):
        run.step()
    before = sum(run.sizes)
    for _ in range(steps - 2):
        out = run.step()
        assert sum(map(len, out.decode)) == rows and not out.prefill
    return run.sizes[-(steps - 2):], before


def test_a_steady_decode_row_costs_a_few_bytes_whatever_its_context():
    rows = 8
    short, short_before = _decode_sizes(100, rows)
    long, long_before = _decode_sizes(100 + 128 * 781, rows)     # 100068: same block edges
    assert max(long) <= 24 * rows and max(short) <= 24 * rows
    # a step without new blocks costs the same; each row gains one block in the window
    # (its tokens cross 128 once), whose larger id takes two bytes more, twice (the
    # row's Sync and the step's fresh blocks)
    assert statistics.mode(short) == statistics.mode(long)
    assert 0 <= sum(long) - sum(short) <= 4 * rows
    # the prompts travel once: the long run's extra bytes are its extra prompt tokens
    extra = sum(len(msgspec.msgpack.encode(_prompt(100 + 128 * 781, i)[100:]))
                for i in range(rows))
    assert extra <= long_before - short_before <= 1.02 * extra


# -- results --------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [
    SamplingFailure("no token has a finite, positive probability"), GrammarError("bad"),
    KeyError("x"), ValueError(), RuntimeError("two", "args")])
def test_a_failure_reads_the_same_in_the_engine(error):
    got = step_result(msgspec.msgpack.decode(
        msgspec.msgpack.encode(result_message(7, StepResult([], error=error))), type=Result))
    assert f"{type(got.error).__name__}: {got.error}" == f"{type(error).__name__}: {error}"
    assert got.tokens == [] and isinstance(got.error, RuntimeError)
    assert type(rebuilt(Failure(type(error).__name__, "again"))) is type(got.error)


def test_tokens_logprobs_and_drafts_come_back_as_they_were():
    result = StepResult([5, 9], [TokenLogprobs(5, -0.25, [(5, -0.25), (3, -1.5)]),
                                 TokenLogprobs(9, -3.0, [(1, -0.5), (9, -3.0)])],
                        drafted=1, accepted=1)
    data = msgspec.msgpack.encode([result_message(3, result), result_message(4, StepResult([1]))])
    back = msgspec.msgpack.decode(data, type=list[Result])
    assert [r.handle for r in back] == [3, 4]
    assert step_result(back[0]) == result and step_result(back[1]) == StepResult([1])


# -- no pickle -----------------------------------------------------------------------------

PICKLING = re.compile(r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle)\b|\bc?pickle\.\w"
                      r"|_object_list\(|_object\(", re.MULTILINE)


def test_nothing_under_runtime_pickles():
    """No pickle (nor torch.distributed's object collectives, which pickle) anywhere the
    engine or its ranks run: whatever reaches a socket decodes into data or fails."""
    found = [f"{path.relative_to(REPO)}: {m.group(0).strip()}"
             for path in sorted((REPO / "runtime").rglob("*.py"))
             for m in PICKLING.finditer(path.read_text())]
    assert found == []


def test_the_plan_decodes_into_data_only():
    """A plan is a typed message: params are validated on the way in, and bytes that are
    not a Plan are refused, not run."""
    request = _request([1, 2], SamplingParams(), "x")
    request.rank, request.slot, request.blocks = 0, 0, {"kv": [0]}
    data = PlanWriter().write(SchedulerOutput(decode=[[request]]), [], [])
    assert PlanReader().read(data).out.decode[0][0].params == SamplingParams()
    with pytest.raises(msgspec.ValidationError):
        PlanReader().read(msgspec.msgpack.encode(["Shutdown"]))
    bad = msgspec.msgpack.encode(["Plan", [[0, "y", [1], {"temperature": -1.0}, None, 0]],
                                  *[[]] * 10])
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        PlanReader().read(bad)
