"""The scheduler on tiny hand-built configurations, driven without a model.

Each step calls schedule() and then commit() with what a model would return: tokens for
every decode row and for every terminal prefill chunk of a request with no output yet.
Covers admission (least-loaded rank, rotating ties, caps, head-of-line blocking), decode
before prefill and decode launches, prefill chunking, block reservation for speculative
positions, preemption and resumption, token-level stops in commit(), and that finishing or
aborting requests gives back every block and MTP slot.
"""
from __future__ import annotations

import itertools

import pytest

from runtime.core.block_pool import BlockPool
from runtime.core.mtp_slots import SlotTable
from runtime.core.request import Request, Status
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import Scheduler, SchedulerConfig
from runtime.core.speculation import Speculation

FORMULAS = {"kv": lambda n: -(-n // 4), "ring": lambda n: min(2, -(-n // 4))}
TOKEN = 7          # what the fake model samples unless told otherwise
EOS = 2
_arrival = itertools.count()


def make(ranks=2, kv=64, ring=16, slots=0, **limits):
    """A scheduler with `kv` and `ring` blocks per rank and `slots` MTP slots per rank."""
    config = dict(ranks=ranks, prefill_slots=2, decode_batch=2, micro_batches=2, k=0,
                  effective_extent=8, max_num_batched_tokens=16, max_num_seqs=8,
                  max_model_len=64)
    config.update(limits)
    table = SlotTable(ranks, slots) if slots else None
    return Scheduler(SchedulerConfig(**config), BlockPool({"kv": kv, "ring": ring}, ranks),
                     FORMULAS, table)


def req(prompt_len, eos=EOS, **params):
    params.setdefault("max_tokens", 16)
    arrival = next(_arrival)
    prompt = list(range(100, 100 + prompt_len))    # never EOS, TOKEN or a stop token
    return Request(f"r{arrival}", prompt, SamplingParams(**params), arrival, eos)


def add(s, *lengths, **params):
    requests = [req(n, **params) for n in lengths]
    for request in requests:
        s.add(request)
    return requests


def model(out, tokens=None):
    """What the model returns for `out`; `tokens` overrides a request's [TOKEN]."""
    tokens = tokens or {}
    rows = [r for launch in out.decode for r in launch]
    rows += [ch.request for ch in out.prefill if ch.terminal and not ch.request.output_ids]
    return {r: list(tokens.get(r, [TOKEN])) for r in rows}


def check_books(s):
    """Blocks held by running requests plus free blocks add up, with no id held twice."""
    for rank in range(s.config.ranks):
        for group, capacity in s.pool.capacity.items():
            held = [i for r in s.running[rank] for i in r.blocks.get(group, [])]
            assert len(held) == len(set(held))
            assert len(held) + s.pool.free_count(rank, group) == capacity
        if s.slots is not None:
            assert s.slots.in_use(rank) == len(s.running[rank])
    for r in s.waiting:
        assert (r.status, r.blocks, r.slot, r.num_computed) == (Status.WAITING, {}, None, 0)


def step(s, tokens=None):
    out = s.schedule()
    s.commit(out, model(out, tokens))
    check_books(s)
    return out


def drain(s, limit=300):
    """Step until no work is left; every step must launch something."""
    for _ in range(limit):
        if not s.has_work():
            return
        assert not step(s).empty, "the scheduler made no progress"
    raise AssertionError(f"still working after {limit} steps")


def assert_all_free(s):
    assert not s.has_work()
    for rank in range(s.config.ranks):
        for group, capacity in s.pool.capacity.items():
            assert s.pool.free_count(rank, group) == capacity, (rank, group)
        if s.slots is not None:
            assert s.slots.in_use(rank) == 0


def chunks(out):
    return [(ch.request, ch.slot, ch.start, ch.length, ch.terminal) for ch in out.prefill]


# -- admission -----------------------------------------------------------------------


def test_admission_alternates_ranks_on_ties():
    s = make()
    reqs = add(s, 2, 2, 2, 2)
    step(s)
    assert [r.rank for r in reqs] == [0, 1, 0, 1]
    assert s.running == [[reqs[0], reqs[2]], [reqs[1], reqs[3]]]


def test_admission_prefers_the_least_loaded_rank():
    s = make()
    a, b, c, d = add(s, 2, 2, 2, 2)
    step(s)
    s.finish(b, "abort")
    s.finish(d, "abort")
    e, f = add(s, 2, 2)
    step(s)
    assert (e.rank, f.rank) == (1, 1)       # rank 0 runs two, rank 1 none then one


def test_ties_rotate_across_steps():
    s = make(ranks=3)
    ranks = []
    for _ in range(4):
        (r,) = add(s, 2)
        step(s)
        ranks.append(r.rank)
        s.finish(r, "abort")
    assert ranks == [0, 1, 2, 0]


def test_request_stays_on_its_rank_until_it_ends():
    s = make()
    a, b, c = add(s, 20, 20, 20, max_tokens=5)
    seen = {a: set(), b: set(), c: set()}
    while s.has_work():
        step(s)
        for r in seen:
            if r.status is Status.RUNNING:
                seen[r].add(r.rank)
    assert [seen[r] for r in (a, b, c)] == [{0}, {1}, {0}]
    assert all(len(r.output_ids) == 5 for r in (a, b, c))


def test_max_num_seqs_caps_the_running_requests():
    s = make(max_num_seqs=3)
    reqs = add(s, 2, 2, 2, 2, 2)
    for _ in range(3):
        step(s)
        assert s.num_running == 3
    assert list(s.waiting) == reqs[3:]


def test_each_rank_runs_at_most_decode_batch_times_micro_batches():
    s = make(ranks=1)
    reqs = add(s, *[2] * 6)
    running = []
    for _ in range(4):
        step(s)
        running.append(len(s.running[0]))
    assert s.config.max_running_per_rank == 4
    assert running == [2, 4, 4, 4]              # two prefill slots a step, then the cap
    assert list(s.waiting) == reqs[4:]


def test_admission_needs_a_free_mtp_slot():
    s = make(ranks=1, slots=1, k=1)
    a, b = add(s, 2, 2)
    out = step(s)
    assert (a.slot, a.slot_generation, out.fresh_slots) == (0, 1, [a])
    assert list(s.waiting) == [b]
    s.finish(a, "abort")
    out = step(s)
    assert (b.slot, b.slot_generation, out.fresh_slots) == (0, 2, [b])


def test_head_of_line_waits_when_no_rank_can_supply_blocks():
    s = make(kv=3)
    a, b, c, d = add(s, 8, 8, 8, 2)
    out = step(s)
    assert [ch.request for ch in out.prefill] == [a, b]
    assert list(s.waiting) == [c, d]             # d would fit, but c is first in line
    assert [s.pool.free_count(rank, "kv") for rank in (0, 1)] == [1, 1]


def test_admission_is_all_or_nothing_across_groups():
    s = make(ranks=1, ring=2)
    (first,) = add(s, 2)
    step(s)                                      # first holds 1 ring block and 1 kv block
    a, b = add(s, 8, 2)                          # a needs 2 ring blocks, 1 is left
    out = step(s)
    assert out.prefill == [] and list(s.waiting) == [a, b]
    assert (s.pool.free_count(0, "kv"), s.pool.free_count(0, "ring")) == (63, 1)
    assert a.blocks == {} and a.status is Status.WAITING


# -- one step: decode, then prefill ----------------------------------------------------


@pytest.mark.parametrize("k, budget_left", [(0, 15), (1, 14)])
def test_decode_comes_first_and_prefill_gets_the_budget_left(k, budget_left):
    s = make(ranks=1, k=k, effective_extent=16)
    (a,) = add(s, 2)
    step(s)
    (b,) = add(s, 30)
    out = step(s)
    assert out.decode == [[a]]
    assert chunks(out) == [(b, 0, 0, budget_left, False)]


def test_decode_rows_of_a_rank_are_cut_into_launches():
    s = make(ranks=1)
    a, b, c = add(s, 2, 2, 2)
    step(s)
    step(s)
    out = step(s)
    assert out.decode == [[a, b], [c]]


def test_each_launch_takes_one_batch_of_every_rank():
    s = make()
    r = add(s, *[2] * 8)
    step(s)
    out = step(s)
    assert out.decode == [[r[0], r[2], r[1], r[3]]]
    assert [(ch.request, ch.request.rank) for ch in out.prefill] == [
        (r[4], 0), (r[5], 1), (r[6], 0), (r[7], 1)]
    out = step(s)
    assert out.decode == [[r[0], r[2], r[1], r[3]], [r[4], r[6], r[5], r[7]]]
    assert out.prefill == []


# -- prefill chunking ------------------------------------------------------------------


def test_long_prompt_is_cut_into_chunks_of_the_effective_extent():
    s = make(ranks=1)
    (a,) = add(s, 20)
    seen = []
    for _ in range(3):
        out = step(s)
        seen.append(chunks(out))
        assert out.decode == []
    assert seen == [[(a, 0, 0, 8, False)], [(a, 0, 8, 8, False)], [(a, 0, 16, 4, True)]]
    assert (a.num_computed, a.output_ids, len(a.blocks["kv"])) == (20, [TOKEN], 5)
    out = step(s)
    assert out.decode == [[a]] and out.prefill == []
    assert (a.num_computed, a.num_tokens) == (21, 22)


def test_non_terminal_chunks_sample_nothing():
    s = make(ranks=1)
    (a,) = add(s, 12)
    out = s.schedule()
    assert model(out) == {}
    s.commit(out, {})
    assert (a.num_computed, a.output_ids, a.prefilling) == (8, [], True)


def test_a_chunk_is_bounded_by_the_ranks_token_budget():
    s = make(ranks=1, max_num_batched_tokens=10)
    a, b = add(s, 8, 8)
    out = step(s)
    assert chunks(out) == [(a, 0, 0, 8, True), (b, 1, 0, 2, False)]
    assert (b.num_computed, b.output_ids) == (2, [])


def test_prefill_slots_bound_the_chunks_of_a_rank():
    s = make(ranks=1)
    a, b, c = add(s, 2, 2, 2)
    out = step(s)
    assert [(ch.request, ch.slot) for ch in out.prefill] == [(a, 0), (b, 1)]
    assert list(s.waiting) == [c]


def test_unfinished_prefills_go_before_admissions():
    s = make(ranks=1)
    (a,) = add(s, 20)
    step(s)
    (b,) = add(s, 4)
    out = step(s)
    assert chunks(out) == [(a, 0, 8, 8, False), (b, 1, 0, 4, True)]


def test_without_chunked_prefill_long_prompts_are_rejected():
    s = make(chunked_prefill=False)
    long = req(9)
    assert s.check(long) == ("prompt of 9 tokens exceeds one prefill dispatch (8) and "
                             "chunked prefill is disabled")
    with pytest.raises(ValueError, match="chunked prefill is disabled"):
        s.add(long)
    assert s.check(req(8)) is None
    assert not s.has_work()


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_chunk():
    s = make(ranks=1, chunked_prefill=False, max_num_batched_tokens=10)
    a, b = add(s, 8, 8)
    out = step(s)
    assert chunks(out) == [(a, 0, 0, 8, True)]
    assert list(s.waiting) == [b]
    out = step(s)                                # budget 10 - 1 decode token = 9
    assert out.decode == [[a]] and chunks(out) == [(b, 0, 0, 8, True)]


def test_prompt_of_max_model_len_is_rejected():
    s = make(max_model_len=16)
    assert s.check(req(16)) == ("prompt of 16 tokens leaves no room to generate under "
                                "max_model_len 16")
    with pytest.raises(ValueError, match="leaves no room"):
        s.add(req(17))
    (a,) = add(s, 15)
    drain(s)
    assert (a.output_ids, a.finish_reason) == ([TOKEN], "length")


# -- blocks for speculative positions ----------------------------------------------------


@pytest.mark.parametrize("k, kv_blocks, fresh", [(0, 1, {}), (1, 2, {(0, "kv"): [1]})])
def test_decode_reserves_blocks_for_all_speculative_positions(k, kv_blocks, fresh):
    s = make(ranks=1, k=k)
    (a,) = add(s, 3)
    step(s)                                      # 4 tokens, the tail at position 3
    out = s.schedule()                           # positions 3 .. 3 + k
    assert out.decode == [[a]]
    assert len(a.blocks["kv"]) == kv_blocks
    assert {key: ids for key, ids in out.fresh_blocks.items() if key[1] == "kv"} == fresh


def test_reservation_crosses_a_block_boundary_with_k_two():
    s = make(ranks=1, k=2)
    (a,) = add(s, 2)
    step(s)                                      # 3 tokens; positions 2, 3, 4 next
    out = s.schedule()
    assert (len(a.blocks["kv"]), len(a.blocks["ring"])) == (2, 2)
    assert out.fresh_blocks == {(0, "kv"): [1], (0, "ring"): [1]}


def test_a_prompt_whose_first_draft_cannot_fit_a_rank_is_rejected():
    s = make(ranks=1, k=1, kv=1)
    with pytest.raises(ValueError, match="a prompt of 3 tokens needs 2 kv blocks, more than "
                                         r"a rank holds \(1\)"):
        s.add(req(3))                            # tail + draft reach position 4: a second block


# -- preemption ----------------------------------------------------------------------


def test_decode_preempts_the_latest_arrival_on_its_own_rank():
    s = make(kv=3)
    a, b, c, d, e = add(s, 8, 2, 2, 2, 8)
    step(s)
    assert [r.rank for r in (a, b, c, d)] == [0, 1, 0, 1]
    assert list(s.waiting) == [e]                # no rank has 2 blocks left
    out = step(s)                                # a needs a 3rd block; rank 0 is full
    assert out.preempted == [c]                  # not d: it runs on rank 1
    assert out.decode == [[a, b, d]]
    assert (c.status, c.rank, c.blocks, c.num_computed) == (Status.WAITING, None, {}, 0)
    assert (c.num_preemptions, s.num_preemptions, c.output_ids) == (1, 1, [TOKEN])
    assert list(s.waiting) == [c, e]             # back at the front of the queue
    assert c not in [ch.request for ch in out.prefill]   # rank 1 had room: not this step
    assert s.pool.free_count(1, "kv") == 1


def test_a_preempted_request_resumes_and_finishes():
    s = make(kv=3)
    a, b, c, d = add(s, 8, 2, 2, 2, max_tokens=4)   # a peaks at 3 blocks
    step(s)
    assert step(s).preempted == [c]
    drain(s)
    assert (c.num_preemptions, c.rank) == (1, 1)     # back where there was room
    assert [len(r.output_ids) for r in (a, b, c, d)] == [4] * 4
    assert {r.finish_reason for r in (a, b, c, d)} == {"length"}
    assert_all_free(s)


def test_resumed_request_recomputes_prompt_and_output_but_the_tail():
    s = make(ranks=1, kv=3)
    a, b = add(s, 8, 2, max_tokens=4)
    step(s)
    step(s)                                      # b preempted with 3 tokens
    assert b.status is Status.WAITING and b.output_ids == [TOKEN]
    while b.status is not Status.RUNNING:
        out = step(s)
    assert chunks(out) == [(b, 0, 0, 2, True)]  # no tokens: b has output already
    assert (b.num_computed, b.output_ids, b.prefilling) == (2, [TOKEN], False)
    assert s.schedule().decode == [[b]]


def test_a_row_that_is_itself_the_latest_preempts_itself():
    s = make(ranks=1, kv=3, slots=4, k=1)
    a, b = add(s, 2, 8, max_tokens=3)
    step(s)                                      # a: 1 block, b: 2 blocks
    slot = b.slot
    out = step(s)                                # b needs a 3rd block
    assert (out.decode, out.preempted) == ([[a]], [b])
    assert (b.slot, s.slots.in_use(0), s.slots.generation(0, slot)) == (None, 1, 1)
    drain(s)
    assert b.slot_generation == 2
    assert [len(r.output_ids) for r in (a, b)] == [3, 3]
    assert_all_free(s)


# -- stops in commit() ---------------------------------------------------------------


def decoding(prompt_len=4, **params):
    """A one-rank K=1 scheduler with one request past its prefill (output [TOKEN])."""
    limits = {"max_model_len": params.pop("max_model_len", 64)}
    s = make(ranks=1, k=1, slots=2, **limits)
    (a,) = add(s, prompt_len, **params)
    step(s)
    assert a.output_ids == [TOKEN] and not a.prefilling
    return s, a


def decode(s, a, tokens):
    out = s.schedule()
    assert out.decode == [[a]]
    return s.commit(out, {a: tokens})


def test_eos_stops_and_drops_later_tokens():
    s, a = decoding()
    assert decode(s, a, [EOS, 9]) == {a: [EOS]}
    assert (a.output_ids, a.status) == ([TOKEN, EOS], Status.FINISHED)
    assert (a.finish_reason, a.stop_reason) == ("stop", None)
    assert_all_free(s)


def test_ignore_eos_keeps_going():
    s, a = decoding(ignore_eos=True)
    assert decode(s, a, [EOS, 9]) == {a: [EOS, 9]}
    assert (a.status, a.finish_reason) == (Status.RUNNING, None)
    assert (a.num_computed, a.num_tokens) == (6, 7)    # tail and accepted draft computed


def test_stop_token_ids_stop_with_the_token_as_reason():
    s, a = decoding(stop_token_ids=(9, 11))
    assert decode(s, a, [9, 5]) == {a: [9]}
    assert (a.output_ids, a.finish_reason, a.stop_reason) == ([TOKEN, 9], "stop", 9)
    assert_all_free(s)


def test_max_tokens_stops_with_length():
    s, a = decoding(max_tokens=2)
    assert decode(s, a, [5, 6]) == {a: [5]}
    assert (a.output_ids, a.finish_reason, a.stop_reason) == ([TOKEN, 5], "length", None)
    assert_all_free(s)


def test_max_model_len_stops_with_length():
    s, a = decoding(prompt_len=6, max_model_len=8)
    assert decode(s, a, [5, 6]) == {a: [5]}
    assert (a.num_tokens, a.finish_reason) == (8, "length")
    assert_all_free(s)


def test_eos_as_the_first_token_ends_the_request():
    s = make(ranks=1)
    (a,) = add(s, 4)
    out = s.schedule()
    assert s.commit(out, {a: [EOS]}) == {a: [EOS]}
    assert (a.finish_reason, a.status) == ("stop", Status.FINISHED)
    assert_all_free(s)


def test_eos_token_id_none_never_stops():
    s = make(ranks=1)
    a = req(4, eos=None, max_tokens=3)
    s.add(a)
    drain(s)
    assert (a.output_ids, a.finish_reason) == ([TOKEN] * 3, "length")


# -- finish and abort ------------------------------------------------------------------


def test_abort_a_waiting_request():
    s = make(ranks=1, max_num_seqs=1)
    a, b = add(s, 2, 2, max_tokens=3)
    step(s)
    s.finish(b, "abort")
    assert (b.status, b.finish_reason, list(s.waiting)) == (Status.FINISHED, "abort", [])
    drain(s)
    assert (b.num_computed, b.output_ids, a.finish_reason) == (0, [], "length")
    assert_all_free(s)


@pytest.mark.parametrize("steps", [1, 3, 4])     # mid prefill, last chunk, decoding
def test_abort_a_running_request_frees_its_blocks_and_slot(steps):
    s = make(ranks=1, slots=2, k=1)
    a, b = add(s, 20, 3)
    for _ in range(steps):
        step(s)
    assert a.status is Status.RUNNING
    s.finish(a, "abort")
    assert (a.blocks, a.slot, a.status, a.finish_reason) == ({}, None, Status.FINISHED, "abort")
    assert s.running == [[b]] and s.slots.in_use(0) == 1
    s.finish(b, "abort")
    assert_all_free(s)


def test_abort_a_preempted_request():
    s = make(ranks=1, kv=3)
    a, b = add(s, 8, 2)
    step(s)
    step(s)
    assert list(s.waiting) == [b]
    s.finish(b, "abort")
    assert (list(s.waiting), b.finish_reason) == ([], "abort")
    s.finish(a, "abort")
    assert_all_free(s)


def test_a_mixed_workload_gives_everything_back():
    s = make(kv=7, ring=8, slots=4, k=1)        # 7 blocks: the largest request alone
    lengths = [3, 17, 9, 2, 12, 5, 20, 7, 1, 14, 6, 10]
    reqs = [req(n, max_tokens=1 + n % 7) for n in lengths]
    for r in reqs:
        s.add(r)
    odd = set(reqs[1::2])                        # these accept their draft on odd steps
    for i in itertools.count():
        if not s.has_work():
            break
        assert i < 300
        if i in (3, 6):
            victim = reqs[5] if i == 3 else reqs[9]
            assert not victim.finished
            s.finish(victim, "abort")
        out = s.schedule()
        rows = {r for launch in out.decode for r in launch}
        s.commit(out, model(out, {r: [TOKEN, TOKEN] for r in rows if (r in odd) == i % 2}))
        check_books(s)
    assert s.num_preemptions > 0
    assert all(r.finished for r in reqs)
    assert [r.finish_reason for r in reqs].count("abort") == 2
    assert_all_free(s)


# -- known problems ------------------------------------------------------------------


def test_prefilling_requests_that_fill_the_pool_still_finish():
    s = make(ranks=1, kv=4)
    a, b = add(s, 12, 12, max_tokens=2)        # 2 first chunks of 8 take all 4 blocks
    drain(s)
    assert [len(r.output_ids) for r in (a, b)] == [2, 2]
    assert_all_free(s)


@pytest.mark.parametrize("spec_name", ["tiny", "deepseek-v4-flash"])
def test_need_through_the_reach_equals_the_formulas(spec_name):
    """need() skips the formulas while a request's blocks reach its positions: over a
    growth with allocations, every answer equals the formulas' own."""
    import generated
    from runtime.core.cache_manager import CacheManager

    groups = generated.load(spec_name).pools.GROUPS
    formulas = {g: grp.blocks_for for g, grp in groups.items()}
    manager = CacheManager(BlockPool({g: 1 << 16 for g in groups}, 1), formulas)
    request = req(4)
    request.rank = 0
    manager.admit(request, [], 4)
    for n in list(range(1, 700)) + list(range(5000, 5300, 7)):
        brute = {g: f(n) - len(request.blocks[g]) for g, f in formulas.items()
                 if f(n) > len(request.blocks[g])}
        assert manager.need(request, n) == brute, n
        manager.allocate(request, brute)
    assert request.reach >= 5293


class _Recording(Speculation):
    """The fixed policy, recording what each decode step asked it."""

    def __init__(self, k):
        super().__init__(k)
        self.asked: list[tuple[int, list[float] | None]] = []

    def choose(self, rows, left=None):
        self.asked.append((len(rows), None if left is None else list(left)))
        return self.k


def test_the_policy_is_given_tokens_left_only_while_no_request_waits():
    """While requests wait, a step is chosen for its throughput; once none waits, for
    the row that would end last: each row's max_tokens left, or the context left."""
    s = make(ranks=1, max_num_seqs=2)
    s.speculation = _Recording(0)
    a, b = add(s, 8, 8, max_tokens=10)
    c, = add(s, 50, max_tokens=40)                # the context (64) ends it first
    step(s)                                       # prefills a and b; c waits
    step(s)
    assert s.speculation.asked[-1] == (2, None)
    drain(s)
    lefts = [left for _, left in s.speculation.asked if left is not None]
    assert lefts[0] == [64 - 51]                  # c alone: 50 + 1 tokens of 64
    assert lefts[-1] == [1]
    assert all(left is None for _, left in s.speculation.asked[:2])
