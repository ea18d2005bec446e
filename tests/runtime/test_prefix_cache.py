"""Prefix caching: the page cache of the block pool, the block layout and keys, the cache
manager's hits, saves and releases on a toy layout, the scheduler's hits, saves and rank
choice (driven without a model), and, end to end on the
reference checkpoint, exactness against the uncached engine: outputs, log-probs and the
state a hit leaves in the pools, under chunking, MTP, eviction and preemption.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from runtime.core.block_pool import BlockPool
from runtime.core.cache_manager import CacheManager, PageCopy
from runtime.core.config import EngineConfig
from runtime.core.mtp_slots import SlotTable
from runtime.core.prefix_cache import Layout, Unsupported
from runtime.core.request import Request, Status
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import Scheduler, SchedulerConfig
from runtime.planning import capacity
from runtime.planning.admission import Admission
from tests.model.support import FIXTURE, REF, reference_params
from tests.runtime.engine_support import assert_all_free, make_engine, random_prompt

BLOCK = 128
_arrival = itertools.count()


# -- the pool's cache of freed pages ----------------------------------------------------

def test_cached_free_pages_count_as_free_and_go_last_least_recent_first():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=1)
    a = pool.allocate(0, {"kv": 2, "ring": 1})            # kv 0, 1; ring 0
    assert pool.put(0, "A", {"kv": a["kv"][0], "ring": a["ring"][0]})
    pool.free(0, a)                                       # kv 0 and ring 0 stay cached
    assert (pool.free_count(0, "kv"), pool.free_count(0, "ring"), pool.cached_blocks(0)) \
        == (4, 2, 1)
    assert pool.allocate(0, {"kv": 3}) == {"kv": [1, 2, 3]}   # plain pages first
    assert pool.get(0, "A") == {"kv": 0, "ring": 0}
    assert pool.allocate(0, {"kv": 1}) == {"kv": [0]}         # then the cached one ...
    assert pool.get(0, "A") is None and pool.evictions == [1]  # ... which drops its entry
    assert pool.allocate(0, {"ring": 2}) == {"ring": [0, 1]}   # its ring page turned plain


def test_holding_a_cached_page_takes_it_off_the_free_list():
    pool = BlockPool({"kv": 2}, ranks=1)
    pages = pool.allocate(0, {"kv": 1})
    pool.put(0, "A", {"kv": 0})
    pool.free(0, pages)
    assert pool.can_allocate(0, {"kv": 2})
    assert not pool.can_allocate(0, {"kv": 2}, holding={"kv": [0]})
    pool.hold(0, {"kv": [0]})
    assert pool.free_count(0, "kv") == 1 and pool.refs(0, "kv", 0) == 1
    pool.free(0, {"kv": [0]})
    with pytest.raises(RuntimeError, match="freed more than held"):
        pool.free(0, {"kv": [0]})


def test_an_entry_is_made_once_and_a_page_belongs_to_one_entry():
    pool = BlockPool({"kv": 4}, ranks=2)
    pool.allocate(1, {"kv": 2})
    assert pool.put(1, "A", {"kv": 0})
    assert not pool.put(1, "A", {"kv": 1}) and not pool.put(1, "B", {"kv": 0})
    assert pool.get(0, "A") is None                          # ranks keep their own


def test_eviction_takes_least_recently_freed_first():
    pool = BlockPool({"kv": 3}, ranks=1)
    pages = pool.allocate(0, {"kv": 3})
    for i, key in enumerate("ABC"):
        pool.put(0, key, {"kv": i})
    pool.free(0, {"kv": [2]})
    pool.free(0, {"kv": [0, 1]})     # freed last first: 1, then 0 (the prefix's head)
    assert pool.allocate(0, {"kv": 2}) == {"kv": [2, 1]}
    assert pool.get(0, "A") is not None and pages


# -- layout and keys --------------------------------------------------------------------

def _layout(k: int = 1) -> Layout:
    return Layout.of(REF.pools.GROUPS, REF.architecture.CONFIG, BLOCK, k)


def test_the_reference_layout_keeps_full_pages_and_the_boundary_ring_pages():
    layout = _layout()
    assert layout.full == ("cmp_c128", "cmp_c4", "idx")
    assert set(layout.ring) == {"ori", "csa_state", "csa_inner_state"}   # hca: none pending
    assert layout.reach == 8          # a CSA state ring of 12 rows keeps [B - 4, B) for 8 more
    assert [layout.ring_entry("ori", b) for b in (128, 256, 384, 512)] == [0, 1, 2, 0]
    assert layout.ring_entry("csa_state", 256) == 0       # rows 252..255: page 63 of a 3-ring
    assert layout.lookahead == 1 and _layout(0).lookahead == 0


def test_a_spec_whose_pages_straddle_blocks_has_no_prefix_caching():
    with pytest.raises(Unsupported, match="page covers 128 tokens, not one block of 256"):
        Layout.of(REF.pools.GROUPS, REF.architecture.CONFIG, 256, 1)


def _request(tokens: list[int], max_tokens: int = 4) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return Request(f"r{next(_arrival)}", list(tokens), params, next(_arrival))


def test_keys_chain_every_token_before_them_and_the_lookahead():
    layout, prompt = _layout(), random_prompt(600, 3)
    keys = layout.keys(_request(prompt), 4)
    assert layout.keys(_request(prompt[:520]), 4) == keys
    changed = prompt[:10] + [prompt[10] + 1] + prompt[11:]
    assert not set(layout.keys(_request(changed), 4)) & set(keys)
    after = prompt[:256] + [prompt[256] + 1] + prompt[257:]     # the token after block 1
    assert layout.keys(_request(after), 4)[:2] == [keys[0], layout.keys(_request(after), 2)[1]]
    assert layout.keys(_request(after), 2)[1] != keys[1]          # MTP: lookahead 1
    assert _layout(0).keys(_request(after), 2) == _layout(0).keys(_request(prompt), 2)


# -- the scheduler, driven without a model -----------------------------------------------

def _scheduler(k: int = 1, **config):
    admission = Admission.plan(EngineConfig(spec="reference", model=FIXTURE,
                                            num_speculative_tokens=k, **config), REF)
    return admission.scheduler()


def _drive(sched) -> None:
    """Run to completion; the fake model samples token 7 wherever a token is due."""
    while sched.has_work():
        out = sched.schedule()
        results = {r: [7] for launch in out.decode for r in launch}
        results.update({ch.request: [7] for ch in out.prefill
                        if ch.terminal and not ch.request.output_ids})
        sched.commit(out, results)


@pytest.mark.parametrize("k", [0, 1])
def test_a_prompt_sent_before_up_to_n_tokens_hits_its_whole_blocks(k):
    """Granularity: a prompt sharing its first N tokens with an earlier one hits at least
    128 * floor((N - 1) / 128) of them, for N down to 129."""
    sched, first = _scheduler(k), random_prompt(1200, 11)
    sched.add(_request(first, max_tokens=1))
    _drive(sched)
    for n in (129, 130, 200, 255, 256, 257, 383, 384, 385, 640, 1000, 1150, 1200):
        tail = [t for t in random_prompt(20, n) if n == len(first) or t != first[n]]
        request = _request(first[:n] + tail, max_tokens=1)
        sched.add(request)
        _drive(sched)
        assert request.num_cached_tokens >= BLOCK * ((n - 1) // BLOCK), n
        assert request.num_cached_tokens < len(request.prompt_ids)      # one token computed
    queries, hits = sched.cache_stats.queries, sched.cache_stats.hits
    assert sum(hits) > 0 and sum(queries) >= sum(hits)


def test_a_cached_prefix_draws_the_request_to_its_rank_within_the_threshold():
    sched, prompt = _scheduler(1, prefix_affinity_threshold=1), random_prompt(700, 5)
    sched.add(_request(prompt, max_tokens=1))
    _drive(sched)
    home = next(r for r in range(8) if sched.pool.cached_blocks(r))
    busy = [_request(random_prompt(50, 100 + i), max_tokens=50) for i in range(2)]
    for request in busy:
        sched.add(request)
    sched.schedule()                                  # two ranks run one request each
    near = _request(prompt[:600] + [3, 4, 5])
    sched.add(near)
    sched.schedule()
    assert near.num_cached_tokens == 512 and near.rank == home


def test_a_cached_prefix_yields_to_a_much_less_loaded_rank():
    sched, prompt = _scheduler(1, prefix_affinity_threshold=0), random_prompt(700, 5)
    sched.add(_request(prompt, max_tokens=1))
    _drive(sched)
    home = next(r for r in range(8) if sched.pool.cached_blocks(r))
    sched.running[home].append(_request([1]))        # the home rank looks busier
    near = _request(prompt[:600] + [3, 4, 5])
    sched.add(near)
    sched.schedule()
    assert near.rank != home and near.num_cached_tokens == 0
    sched.running[home].pop()


def test_every_page_is_free_or_cached_once_requests_end():
    sched = _scheduler(1)
    shared = random_prompt(500, 9)
    for i in range(12):
        sched.add(_request(shared[: 200 + 25 * i] + random_prompt(30, i), max_tokens=9))
    _drive(sched)
    pool = sched.pool
    for rank in range(8):
        for group, total in pool.capacity.items():
            assert pool.free_count(rank, group) == total
    assert sum(pool.cached_blocks(r) for r in range(8)) > 0


# pools of blocks of 4 tokens: a full group and a ring of two 4-row pages
TOY_FORMULAS = {"kv": lambda n: -(-n // 4), "ring": lambda n: min(2, -(-n // 4))}
TOY_LAYOUT = Layout(block_size=4, lookahead=0, full=("kv",), ring={"ring": (4, 2)}, reach=4)


@pytest.mark.parametrize(("lengths", "kv", "ring", "budget"), [
    ((1, 6, 11), 7, 8, 8), ((9, 4, 1, 10), 10, 8, 8), ((2, 5, 2, 10), 9, 10, 16)])
def test_a_page_a_pending_save_reads_goes_to_nobody_before_the_copy(lengths, kv, ring,
                                                                      budget):
    """A request preempted (or ended) in the step after it passed a block boundary is
    saved at the start of the next step, from ring pages its release freed. None of
    them may go to another request in between: the runner would zero and write it
    before the copy, and register the garbage under the first one's prefix. (Found by a
    search over such small pools; each case handed a page over before the fix.)"""
    config = SchedulerConfig(ranks=1, prefill_slots=2, decode_batch=4, micro_batches=1, k=0,
                             effective_extent=64, max_num_batched_tokens=budget,
                             max_num_seqs=4, max_model_len=64)
    sched = Scheduler(config, BlockPool({"kv": kv, "ring": ring}, ranks=1), TOY_FORMULAS,
                      SlotTable(1, 4), TOY_LAYOUT)
    for i, n in enumerate(lengths):
        sched.add(_request(list(range(100 + 10 * i, 100 + 10 * i + n)), max_tokens=10))
    handed: dict = {}       # (group, page) -> the request a page went to in the last step
    finals = 0
    for _ in range(100):
        if not sched.has_work():
            break
        out = sched.schedule()
        for save in out.saves:                     # they run first in the step
            finals += save.request.status is not Status.RUNNING      # an ended one's
            assert all(handed.get((c.group, c.src), save.request) is save.request
                       for c in save.copies)
        handed = {(g, page): r for r in sched.running[0] for g, ids in r.blocks.items()
                  for page in ids if page in out.fresh_blocks.get((0, g), ())}
        results = {r: [7] for launch in out.decode for r in launch}
        results.update({ch.request: [7] for ch in out.prefill if ch.terminal})
        sched.commit(out, results)
    assert not sched.has_work() and finals > 0 and sched.num_preemptions > 0
    assert all(sched.pool.free_count(0, g) == n for g, n in sched.pool.capacity.items())


# -- the cache manager on the toy layout, without a scheduler ---------------------------

def _manager() -> CacheManager:
    return CacheManager(BlockPool({"kv": 16, "ring": 8}, ranks=1), TOY_FORMULAS, TOY_LAYOUT)


def _admit(manager: CacheManager, request: Request, end: int, hit=()) -> None:
    """Put the request on rank 0 with `hit` and give it blocks for positions up to `end`."""
    request.status, request.rank = Status.RUNNING, 0
    manager.admit(request, list(hit), end)
    manager.allocate(request, manager.need(request, end))


def _assert_all_free(manager: CacheManager) -> None:
    pool = manager.pool
    for g, n in pool.capacity.items():
        assert pool.free_count(0, g) == n and not any(pool.refs(0, g, i) for i in range(n))


def _cached_prompt(manager: CacheManager) -> list[int]:
    """A prompt of 10 tokens, computed and freed: its blocks 0 and 1 are entries."""
    prompt = list(range(100, 110))
    first = _request(prompt)
    _admit(manager, first, 10)
    saves = manager.snapshots(first, 10)
    first.num_computed = 10
    manager.register(saves, [])
    manager.free(first)
    return prompt


def test_snapshots_are_saved_in_boundary_order_and_registered_at_commit():
    manager, request = _manager(), _request(range(100, 110))
    _admit(manager, request, 10)                             # kv 0, 1, 2; ring 0, 1
    saves = manager.snapshots(request, 10)
    assert [(s.boundary, s.copies, s.pages) for s in saves] == [
        (4, [PageCopy(0, "ring", 0, 2)], {"kv": 0, "ring": 2}),
        (8, [PageCopy(0, "ring", 1, 3)], {"kv": 1, "ring": 3})]
    keys, pool = TOY_LAYOUT.keys(request, 2), manager.pool
    assert pool.get(0, keys[0]) is None and pool.refs(0, "ring", 0) == 2   # pinned by its save
    request.num_computed = 10
    manager.register(saves, [])
    assert [pool.get(0, key) for key in keys] == [s.pages for s in saves]
    assert pool.refs(0, "ring", 0) == 1 and pool.refs(0, "ring", 2) == 0   # copies: cached
    again = _request(range(100, 110))
    _admit(manager, again, 10)
    assert manager.snapshots(again, 10) == []                # an entry is saved once
    manager.free(request)
    manager.free(again)
    _assert_all_free(manager)


def test_a_hit_holds_its_pages_and_restores_the_ring_of_its_boundary():
    manager = _manager()
    prompt = _cached_prompt(manager)
    request = _request(prompt[:9] + [7, 7, 7])
    hit = manager.lookup(request, 0, 11)
    assert hit == [{"kv": 0, "ring": 2}, {"kv": 1, "ring": 3}] and manager.cached_tokens(hit) == 8
    assert manager.can_admit(0, 12, hit)
    _admit(manager, request, 12, hit)
    assert request.blocks["kv"][:2] == [0, 1] and len(request.blocks["kv"]) == 3
    assert (request.num_computed, request.num_cached_tokens, request.cached_blocks) == (8, 8, 2)
    assert (manager.stats.queries, manager.stats.hits) == ([22], [8])
    copies, pin = manager.restore(request, hit)
    ring = request.blocks["ring"][TOY_LAYOUT.ring_entry("ring", 8)]
    assert copies == [PageCopy(0, "ring", 3, ring)] and pin == (0, {"ring": [3]})
    assert manager.pool.refs(0, "ring", 3) == 1 and manager.pool.refs(0, "ring", 2) == 0
    manager.register([], [pin])
    manager.free(request)
    _assert_all_free(manager)


def test_an_ending_request_leaves_its_last_boundary_to_the_next_step():
    manager, request = _manager(), _request([1, 2, 3])
    _admit(manager, request, 6)
    request.output_ids, request.num_computed = [4, 5, 6], 5      # decoded past 4
    manager.free(request)
    assert request.blocks == {} and manager.has_finals()
    finals = manager.take_finals()
    assert [(s.boundary, s.pages["kv"]) for s in finals] == [(4, 0)] and not manager.has_finals()
    assert manager.pool.refs(0, "kv", 0) == 1                    # the save holds what it reads
    manager.register(finals, [])
    assert manager.pool.get(0, TOY_LAYOUT.keys(request, 1)[0]) == finals[0].pages
    _assert_all_free(manager)


# -- end to end: exactness against the uncached engine ----------------------------------

@pytest.fixture(scope="module")
def params():
    return reference_params()


SHARED = (127, 128, 129, 255, 256, 257, 1000)
FIRST = random_prompt(1100, 1)
PROMPTS = [FIRST[:n] + random_prompt(40, 100 + n) for n in SHARED]
LOGPROBS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)


def _run(engine, prompts, params=LOGPROBS):
    """Each request's tokens and every token's log-prob, the first prompt sent first."""
    requests = [engine.add_request(p, params) for p in prompts]
    logprobs: dict[str, list] = {r.request_id: [] for r in requests}
    while engine.has_unfinished():
        for out in engine.step():
            logprobs[out.request_id] += [(lp.token, lp.logprob, lp.top) for lp in out.logprobs]
    return [(r.output_ids, logprobs[r.request_id]) for r in requests]


def _same(cold, warm) -> None:
    for (ids, lps), (ids2, lps2) in zip(cold, warm):
        assert ids == ids2
        for (t, lp, top), (t2, lp2, top2) in zip(lps, lps2, strict=True):
            assert t == t2 and lp == pytest.approx(lp2, abs=1e-4)
            assert [i for i, _ in top] == [i for i, _ in top2]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["compiled-eager", "torch"])
@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.parametrize("extent", [128, 8192], ids=["chunked-128", "whole"])
def test_hits_give_the_uncached_outputs_and_logprobs(params, backend, k, extent):
    if backend == "torch" and (k, extent) != (1, 128):
        pytest.skip("the torch backend once, in the suite's time")
    config = dict(num_speculative_tokens=k, long_prefill_token_threshold=extent,
                  backend=backend, prefix_affinity_threshold=64)   # every prompt to its hit
    cold = make_engine(params, enable_prefix_caching=False, **config)
    warm = make_engine(params, **config)
    expected = _run(cold, [FIRST]) + _run(cold, PROMPTS)
    got = _run(warm, [FIRST]) + _run(warm, PROMPTS)
    _same(expected, got)
    info = warm.prefix_cache_info()
    lookahead = 1 if k else 0
    assert info["hits"] == sum(BLOCK * min((n - lookahead) // BLOCK, (n + 39) // BLOCK)
                               for n in SHARED)
    assert_all_free(warm)


def _window(engine, request) -> torch.Tensor:
    """The sliding-window rows [end - 127, end) of every layer (the MTP layer's too)."""
    end, pool = request.num_computed, engine.executor.pools.ori
    return torch.stack([pool[request.rank, :, request.blocks["ori"][(p // BLOCK) % 3],
                             p % BLOCK] for p in range(max(0, end - 127), end)], 1)


@pytest.mark.slow
def test_a_hit_restores_the_window_and_the_mtp_layer_rows(params):
    """After the prefill of a prompt that hit, its window (main and MTP layers) equals
    the one an uncached engine computes."""
    for n in (129, 250, 1000):
        windows = []
        for cache in (False, True):
            engine = make_engine(params, num_speculative_tokens=1, backend="compiled-eager",
                                 enable_prefix_caching=cache)
            _run(engine, [FIRST])
            request = engine.add_request(FIRST[:n] + random_prompt(20, n), LOGPROBS)
            while request.num_computed < len(request.prompt_ids):
                engine.step()
            windows.append(_window(engine, request))
        assert torch.allclose(windows[0], windows[1], atol=1e-5), n


@pytest.mark.slow
def test_four_times_oversubscribed_pools_evict_and_keep_every_output(params):
    families = [random_prompt(512, 40 + f) for f in range(8)]
    prompts = [families[i % 8] + random_prompt(100, 60 + i) for i in range(64)]
    many = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    calm = make_engine(params, num_speculative_tokens=1, backend="compiled-eager")
    expected = [o.output_ids for o in calm.generate(prompts, many)]
    copies = _layout().copies
    tight = capacity.bytes_for(REF.pools.GROUPS, 8, 1024, copies)
    engine = make_engine(params, num_speculative_tokens=1, backend="compiled-eager",
                         kv_cache_memory=tight, max_model_len=1024, max_num_seqs=16)
    assert len(prompts) * 620 >= 4 * 8 * engine.capacity.tokens         # 4x oversubscribed
    assert [o.output_ids for o in engine.generate(prompts, many)] == expected
    info = engine.prefix_cache_info()
    assert info["hits"] > 0 and sum(r["evictions"] for r in info["ranks"]) > 0
    assert_all_free(engine)


@pytest.mark.slow
def test_a_preempted_request_hits_its_own_blocks_when_it_comes_back(params):
    """Prompts of 120 tokens fill a rank's pools at admission; decoding past position
    131 needs a second CSA block, which only preemption frees. No two prompts share a
    prefix: the hits are re-admitted requests finding the block they saved."""
    prompts = [random_prompt(120, 70 + i) for i in range(64)]
    many = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    calm = make_engine(params, num_speculative_tokens=1, backend="compiled-eager")
    expected = [o.output_ids for o in calm.generate(prompts, many)]
    tight = capacity.bytes_for(REF.pools.GROUPS, 8, 128 * 8, _layout().copies)
    engine = make_engine(params, num_speculative_tokens=1, backend="compiled-eager",
                         kv_cache_memory=tight, max_model_len=1024)
    assert [o.output_ids for o in engine.generate(prompts, many)] == expected
    assert engine.scheduler.num_preemptions > 0
    assert engine.prefix_cache_info()["hits"] > 0          # only re-admissions can hit
    assert_all_free(engine)


def _two_turns(engine, firsts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Every conversation's first turn at once, then every second turn: the first
    prompt, its answer and a new user message."""
    answers = [o.output_ids for o in engine.generate(firsts, params)]
    seconds = [first + answer + random_prompt(30, 950 + i)
               for i, (first, answer) in enumerate(zip(firsts, answers))]
    return answers + [o.output_ids for o in engine.generate(seconds, params)]


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_a_chat_workload_under_preemption_gives_the_uncached_completions(params, k):
    """Conversations share a system prompt that crosses two block boundaries, each runs
    two turns (the second resends the first turn and its answer), and the pools hold
    512 tokens per rank where two conversations run, so decoding requests are
    preempted, some in the step after they passed a boundary whose save is still to be
    taken. Every completion equals the cache-off run's; preemptions and hits happen."""
    system = random_prompt(260, 900)
    firsts = [system + random_prompt(20 + 5 * i, 910 + i) for i in range(16)]
    turn = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    config = dict(num_speculative_tokens=k, backend="compiled-eager", max_model_len=512)
    expected = _two_turns(make_engine(params, enable_prefix_caching=False, **config),
                          firsts, turn)
    running = 8 if k else 16                     # the rank's decode capacity for this K
    tight = capacity.bytes_for(REF.pools.GROUPS, running, 512, _layout(k).copies)
    engine = make_engine(params, kv_cache_memory=tight, **config)
    assert _two_turns(engine, firsts, turn) == expected
    assert engine.scheduler.num_preemptions > 0
    assert engine.prefix_cache_info()["hits"] > 0
    assert_all_free(engine)
