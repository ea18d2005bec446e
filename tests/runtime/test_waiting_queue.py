"""The waiting queue: preempted requests first, then turns between the bodies requests
came from (FIFO within each), and aborts of waiting requests in O(1) each. Torch-free:
the queue alone, then the scheduler driven without a model."""
from __future__ import annotations

import time

import pytest

from runtime.core.request import Request, Status
from runtime.core.sampling_params import SamplingParams
from runtime.core.waiting_queue import WaitingQueue
from tests.runtime.test_scheduler import assert_all_free, check_books, drain, make, step

PARAMS = SamplingParams(max_tokens=2)


def _requests(n: int, group: str | None = None, start: int = 0) -> list[Request]:
    return [Request(f"{group}-{start + i}", [100, 101], PARAMS, start + i, group=group)
            for i in range(n)]


def _pop_all(queue: WaitingQueue) -> list[Request]:
    return [queue.popleft() for _ in range(len(queue))]


def test_groups_take_turns_each_in_arrival_order():
    queue = WaitingQueue()
    a, b = _requests(3, "a"), _requests(2, "b", 10)
    alone = _requests(2, None, 20)
    for r in a + b + alone:
        queue.append(r)
    expected = [a[0], b[0], alone[0], alone[1], a[1], b[1], a[2]]
    assert list(queue) == expected                  # iteration: the order of admission
    assert _pop_all(queue) == expected
    assert not queue and queue.peek() is None
    with pytest.raises(IndexError):
        queue.popleft()


def test_without_groups_the_queue_is_first_come_first_served():
    queue = WaitingQueue()
    reqs = _requests(5)
    for r in reqs:
        queue.append(r)
    assert _pop_all(queue) == reqs


def test_preempted_requests_go_first_the_last_preempted_first():
    queue = WaitingQueue()
    a, b = _requests(2, "a"), _requests(1, "b", 10)
    for r in a + b:
        queue.append(r)
    first, second = _requests(2, "p", 20)
    queue.appendleft(first)
    queue.appendleft(second)
    assert queue.peek() is second
    assert _pop_all(queue) == [second, first, a[0], b[0], a[1]]


def test_a_group_that_comes_back_joins_the_back_of_the_turns():
    queue = WaitingQueue()
    (a0,), b = _requests(1, "a"), _requests(2, "b", 10)
    for r in [a0] + b:
        queue.append(r)
    assert queue.popleft() is a0                   # a has nothing left: out of the turns
    (a1,) = _requests(1, "a", 5)
    queue.append(a1)
    assert _pop_all(queue) == [b[0], a1, b[1]]


def test_one_body_of_many_delays_another_by_one_admission():
    queue = WaitingQueue()
    for r in _requests(16_384, "big"):
        queue.append(r)
    queue.popleft()
    (other,) = _requests(1, "other", 20_000)
    queue.append(other)
    assert queue.popleft().group == "big"          # big's turn came first
    assert queue.popleft() is other


def test_discarded_requests_are_skipped_and_not_counted():
    queue = WaitingQueue()
    a, b = _requests(3, "a"), _requests(2, "b", 10)
    for r in a + b:
        queue.append(r)
    assert queue.discard(a[0]) and queue.discard(b[1])
    assert not queue.discard(b[1])                  # not waiting any more
    assert (len(queue), a[0] in queue, a[1] in queue) == (3, False, True)
    assert list(queue) == [a[1], b[0], a[2]]
    assert queue.peek() is a[1]
    assert _pop_all(queue) == [a[1], b[0], a[2]]


def test_a_request_cannot_wait_twice():
    queue = WaitingQueue()
    (r,) = _requests(1)
    queue.append(r)
    with pytest.raises(ValueError, match="already waiting"):
        queue.appendleft(r)


def test_discards_compact_the_queue():
    """What the queue holds stays within twice the waiting requests (and a little), so
    aborted requests are not kept until their turn comes."""
    queue = WaitingQueue()
    reqs = _requests(1000, "a") + _requests(1000, "b", 1000)
    for r in reqs:
        queue.append(r)
    for r in reqs[:-10]:
        queue.discard(r)
    assert len(queue) == 10
    assert queue._held <= 2 * len(queue) + 64
    assert _pop_all(queue) == reqs[-10:]


def test_aborting_many_waiting_requests_is_linear():
    """50,000 waiting requests aborted newest first (a deque.remove each: 1.25e9 element
    comparisons, minutes) take well under a second."""
    s = make(ranks=1, max_num_seqs=1)
    reqs = [Request(f"r{i}", [100, 101], PARAMS, i, group="body") for i in range(50_000)]
    for r in reqs:
        s.add(r)
    started = time.perf_counter()
    for r in reversed(reqs):
        s.finish(r, "abort")
    assert time.perf_counter() - started < 2.0
    assert not s.has_work() and len(s.waiting) == 0
    assert all(r.finish_reason == "abort" for r in reqs)


# -- the scheduler ---------------------------------------------------------------------


def test_the_scheduler_admits_by_turns_between_bodies():
    s = make(ranks=1, max_num_seqs=1)
    body = _requests(6, "body")
    late = _requests(2, None, 10)
    for r in body + late:
        s.add(r)
    admitted = []
    while s.has_work():
        out = step(s)
        admitted += [ch.request for ch in out.prefill if ch.start == 0]
    assert admitted == [body[0], late[0], late[1], body[1], body[2], body[3], body[4], body[5]]
    assert_all_free(s)


def test_finishing_a_waiting_request_keeps_the_books():
    s = make(ranks=1, max_num_seqs=1)
    a, b, c = _requests(3, "body")
    for r in (a, b, c):
        s.add(r)
    step(s)
    s.finish(b, "abort")
    assert (b.status, b.finish_reason) == (Status.FINISHED, "abort")
    assert (len(s.waiting), list(s.waiting)) == (1, [c])
    check_books(s)
    drain(s)
    assert (a.finish_reason, b.output_ids, c.finish_reason) == ("length", [], "length")
    assert_all_free(s)


def test_a_preempted_request_of_a_body_goes_before_the_other_bodies():
    s = make(ranks=1, kv=3)
    a, b = _requests(2, "x")
    a.prompt_ids, b.prompt_ids = list(range(100, 108)), [100, 101]
    for r in (a, b):
        s.add(r)
    (c,) = _requests(1, "y", 10)
    step(s)
    s.add(c)
    out = step(s)                                  # a needs a third block: b is preempted
    assert out.preempted == [b]
    assert list(s.waiting)[0] is b


def test_the_engine_queues_a_request_in_its_group():
    """Engine.add_request(..., group=) reaches the scheduler's turns (no step runs; the
    engine's imports are torch's, so they are here and not at the top)."""
    import generated
    from runtime.core.config import EngineConfig
    from runtime.engine.engine import Engine
    from runtime.weights.loader import load_params
    from tests.conftest import REPO

    model, spec = REPO / "models" / "tiny", generated.load("tiny")
    engine = Engine(EngineConfig(spec="tiny", model=model), spec, load_params(model, spec),
                    None)
    body = [engine.add_request([5, 6, 7], PARAMS, group="body") for _ in range(3)]
    alone = engine.add_request([5, 6, 7], PARAMS)
    assert [r.group for r in body] == ["body"] * 3 and alone.group is None
    assert list(engine.scheduler.waiting) == [body[0], alone, body[1], body[2]]
    engine.abort(body[1].request_id)
    assert list(engine.scheduler.waiting) == [body[0], alone, body[2]]
    assert engine.snapshot()["waiting"] == 3


def test_take_idle_takes_the_first_request_of_an_idle_group_in_turn_order():
    queue = WaitingQueue()
    a, b, alone = _requests(2, "a"), _requests(2, "b", 10), _requests(1, None, 20)
    for r in a + b + alone:
        queue.append(r)
    queue.discard(b[0])                          # a discarded head is passed over
    busy = {("group", "a")}
    assert queue.take_idle(lambda key: key not in busy) is b[1]
    assert queue.take_idle(lambda key: key not in busy) is alone[0]
    assert queue.take_idle(lambda key: key not in busy) is None   # only a's are left
    assert list(queue) == a and len(queue) == 2
    queue.appendleft(b[1])                       # taken requests can be queued again
    assert _pop_all(queue) == [b[1]] + a


# -- fair share of the running slots ---------------------------------------------------


def _fill(s, body: list[Request]) -> None:
    for r in body:
        s.add(r)
    step(s)
    assert s.num_running == s.config.max_num_seqs


def test_a_body_with_nothing_running_gets_a_row_of_the_body_filling_the_batch():
    """A body whose long requests take every slot would hold a newcomer's first token for
    their whole length; instead its latest row is preempted (and comes back first)."""
    s = make(ranks=1, max_num_seqs=4, decode_batch=4, micro_batches=1, prefill_slots=4)
    body = [Request(f"b-{i}", [100, 101], SamplingParams(max_tokens=40), i, group="body")
            for i in range(6)]
    _fill(s, body)
    (late,) = _requests(1, "late", 10)
    s.add(late)
    out = step(s)
    assert out.preempted == [body[3]]              # the latest admitted of the body
    assert late.status is Status.RUNNING and [ch.request for ch in out.prefill] == [late]
    assert list(s.waiting)[0] is body[3]           # first when a slot frees
    assert step(s).preempted == []                 # one preemption per newcomer
    drain(s)
    assert late.finish_reason == "length" and body[3].finish_reason == "length"
    assert_all_free(s)


def test_no_row_is_preempted_for_a_body_already_running_or_within_its_share():
    s = make(ranks=1, max_num_seqs=4, decode_batch=4, micro_batches=1, prefill_slots=4)
    long = SamplingParams(max_tokens=40)
    a = [Request(f"a-{i}", [100, 101], long, i, group="a") for i in range(3)]
    b = [Request(f"b-{i}", [100, 101], long, 10 + i, group="b") for i in range(2)]
    _fill(s, a + b[:1])
    s.add(b[1])                 # b runs a row already: it waits for a free slot
    assert step(s).preempted == []
    alone = Request("alone", [100, 101], long, 20)
    s.add(alone)                # a's 3 rows are over its share (4 // 3), b's 1 is not
    assert step(s).preempted == [a[2]]
    s.add(Request("alone-2", [100, 101], long, 21))
    assert step(s).preempted == [a[1]]             # 4 bodies: a row each
    s.add(Request("alone-3", [100, 101], long, 22))
    assert step(s).preempted == []                 # no body runs more than one
    drain(s)
    assert_all_free(s)


def test_requests_without_a_body_never_preempt_each_other():
    s = make(ranks=1, max_num_seqs=2, decode_batch=2, micro_batches=1, prefill_slots=4)
    reqs = [Request(f"r-{i}", [100, 101], SamplingParams(max_tokens=8), i) for i in range(5)]
    for r in reqs:
        s.add(r)
    while s.has_work():
        assert step(s).preempted == []
    assert s.num_preemptions == 0


def test_fair_share_off_leaves_the_newcomer_waiting():
    s = make(ranks=1, max_num_seqs=4, decode_batch=4, micro_batches=1, prefill_slots=4,
             fair_share=False)
    _fill(s, [Request(f"b-{i}", [100, 101], SamplingParams(max_tokens=40), i, group="body")
              for i in range(4)])
    (late,) = _requests(1, "late", 10)
    s.add(late)
    assert step(s).preempted == [] and late.status is Status.WAITING
