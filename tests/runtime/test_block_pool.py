"""The torch-free bookkeeping under the scheduler, on primitive inputs.

BlockPool: per-rank free lists, all-or-nothing allocation across groups, reuse order and
usage. SlotTable: MTP slot acquire/release and reuse generations (0 is never issued).
capacity: plan() sizes ring groups for max_running requests and gives every full group the
same token capacity from the rest, refuses a budget that cannot hold the ring pages, and
round-trips with bytes_for().
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from runtime.core.block_pool import BlockPool
from runtime.core.mtp_slots import SlotTable
from runtime.planning import capacity

# -- BlockPool -----------------------------------------------------------------------


def test_fresh_pool_is_empty_on_every_rank():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=3)
    assert pool.ranks == 3
    for rank in range(3):
        assert (pool.free_count(rank, "kv"), pool.free_count(rank, "ring")) == (4, 2)
        assert (pool.used(rank, "kv"), pool.usage(rank)) == (0, 0.0)


def test_allocate_hands_out_lowest_ids_first_per_rank():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=2)
    assert pool.allocate(0, {"kv": 2, "ring": 1}) == {"kv": [0, 1], "ring": [0]}
    assert pool.allocate(0, {"kv": 1}) == {"kv": [2]}
    assert pool.allocate(1, {"kv": 1}) == {"kv": [0]}     # ranks are independent
    assert (pool.free_count(0, "kv"), pool.free_count(0, "ring")) == (1, 1)
    assert pool.free_count(1, "kv") == 3


def test_allocate_leaves_out_groups_needing_nothing():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=1)
    assert pool.allocate(0, {"kv": 1, "ring": 0}) == {"kv": [0]}
    assert pool.free_count(0, "ring") == 2


def test_allocation_is_all_or_nothing_across_groups():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=1)
    assert pool.can_allocate(0, {"kv": 4, "ring": 2})
    assert not pool.can_allocate(0, {"kv": 1, "ring": 3})
    with pytest.raises(RuntimeError, match="rank 0 cannot supply"):
        pool.allocate(0, {"kv": 1, "ring": 3})
    assert (pool.free_count(0, "kv"), pool.free_count(0, "ring")) == (4, 2)


def test_freed_ids_are_reused_most_recent_first():
    pool = BlockPool({"kv": 6}, ranks=1)
    pool.allocate(0, {"kv": 4})                  # 0, 1, 2, 3
    pool.free(0, {"kv": [1, 2]})
    assert pool.free_count(0, "kv") == 4
    assert pool.allocate(0, {"kv": 3}) == {"kv": [1, 2, 4]}


def test_free_returns_every_group_to_capacity():
    pool = BlockPool({"kv": 4, "ring": 2}, ranks=2)
    held = pool.allocate(1, {"kv": 3, "ring": 2})
    pool.free(1, held)
    assert (pool.free_count(1, "kv"), pool.free_count(1, "ring")) == (4, 2)
    assert pool.usage(1) == 0.0


def test_usage_is_the_fullest_groups_fraction():
    pool = BlockPool({"kv": 8, "ring": 2}, ranks=2)
    pool.allocate(0, {"kv": 2, "ring": 1})
    assert pool.usage(0) == 0.5                  # ring 1/2 beats kv 2/8
    pool.allocate(0, {"kv": 4})
    assert pool.usage(0) == 0.75                 # kv 6/8
    assert pool.used(0, "kv") == 6
    assert pool.usage(1) == 0.0


def test_usage_skips_groups_of_no_capacity():
    pool = BlockPool({"kv": 4, "none": 0}, ranks=1)
    pool.allocate(0, {"kv": 1})
    assert pool.usage(0) == 0.25


# -- SlotTable -----------------------------------------------------------------------


def test_acquire_takes_lowest_free_slot_with_generation_one():
    table = SlotTable(ranks=2, slots_per_rank=3)
    assert table.acquire(0) == (0, 1)
    assert table.acquire(0) == (1, 1)
    assert table.acquire(1) == (0, 1)
    assert (table.in_use(0), table.in_use(1)) == (2, 1)


def test_every_acquire_bumps_the_slots_generation():
    table = SlotTable(ranks=1, slots_per_rank=2)
    slot, gen = table.acquire(0)
    table.release(0, slot)
    assert table.generation(0, slot) == gen == 1   # release does not bump
    assert table.acquire(0) == (slot, 2)
    table.release(0, slot)
    assert table.acquire(0) == (slot, 3)
    assert table.generation(0, 1) == 0           # never acquired


def test_generation_zero_is_never_issued():
    table = SlotTable(ranks=2, slots_per_rank=2)
    issued = []
    for _ in range(5):
        for rank in range(2):
            pairs = [table.acquire(rank) for _ in range(2)]
            issued += [gen for _, gen in pairs]
            for slot, _ in pairs:
                table.release(rank, slot)
    assert min(issued) == 1
    assert sorted(set(issued)) == [1, 2, 3, 4, 5]


def test_full_rank_refuses_to_acquire():
    table = SlotTable(ranks=2, slots_per_rank=1)
    table.acquire(0)
    assert not table.can_acquire(0)
    assert table.can_acquire(1)
    with pytest.raises(RuntimeError, match="rank 0 has no free MTP slot"):
        table.acquire(0)
    table.release(0, 0)
    assert table.can_acquire(0) and table.in_use(0) == 0


# -- capacity ------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    ring_pages: int | None
    rows_per_page: int
    tokens_per_row: int
    block_bytes: int


# Per token: a 8/4 = 2 bytes, b 4/8 = 0.5 bytes. Ring: 2 pages of 10 bytes per request.
GROUPS = {"r": Group(2, 4, 1, 10), "a": Group(None, 4, 1, 8), "b": Group(None, 1, 8, 4)}


def test_plan_sizes_rings_for_max_running_and_shares_the_rest():
    cap = capacity.plan(GROUPS, budget_bytes=60 + 160, max_running=3)
    assert cap.blocks == {"r": 6, "a": 16, "b": 8}
    assert cap.tokens == 64
    assert cap.bytes == 220


def test_plan_gives_full_groups_equal_token_capacity():
    cap = capacity.plan(GROUPS, budget_bytes=60 + 250 + 1, max_running=3)
    assert cap.tokens == 96                      # 97 would need 25 + 13 pages: 252 > 251
    assert cap.blocks["a"] * 4 == cap.tokens     # 24 pages of 4 tokens
    assert cap.blocks["b"] == 96 // 8            # 12 pages of 8 tokens
    assert cap.bytes == 60 + 24 * 8 + 12 * 4


def test_plan_with_only_ring_groups():
    rings = {"r": GROUPS["r"], "s": Group(3, 8, 1, 2)}
    cap = capacity.plan(rings, budget_bytes=1000, max_running=4)
    assert cap.blocks == {"r": 8, "s": 12}
    assert (cap.tokens, cap.bytes) == (0, 80 + 24)


@pytest.mark.parametrize("budget", [0, 59])
def test_plan_refuses_a_budget_below_the_ring_pages(budget):
    with pytest.raises(ValueError, match=f"a budget of {budget} bytes per rank cannot hold "
                                         "the 60 bytes of ring pages that 3 running"):
        capacity.plan(GROUPS, budget, max_running=3)


def test_plan_refuses_a_budget_with_no_token_left_for_full_groups():
    with pytest.raises(ValueError, match="leaves no room for one page of history"):
        capacity.plan(GROUPS, 60 + 11, max_running=3)    # one page each costs 8 + 4
    assert capacity.plan(GROUPS, 60 + 12, max_running=3).tokens == 4


def test_bytes_for_counts_rings_and_whole_pages():
    assert capacity.bytes_for(GROUPS, max_running=3, tokens=64) == 60 + 16 * 8 + 8 * 4
    assert capacity.bytes_for(GROUPS, max_running=3, tokens=65) == 60 + 17 * 8 + 9 * 4
    assert capacity.bytes_for(GROUPS, max_running=1, tokens=0) == 20


@pytest.mark.parametrize("tokens", [8, 64, 800])
@pytest.mark.parametrize("max_running", [1, 3])
def test_bytes_for_round_trips_with_plan(tokens, max_running):
    budget = capacity.bytes_for(GROUPS, max_running, tokens)
    cap = capacity.plan(GROUPS, budget, max_running)
    assert cap.tokens == tokens
    assert cap.blocks == {"r": 2 * max_running, "a": tokens // 4, "b": tokens // 8}
    assert cap.bytes == budget


@pytest.mark.parametrize("tokens", [1, 7, 100])
def test_plan_of_bytes_for_holds_the_tokens_in_every_full_group(tokens):
    same = {"r": GROUPS["r"], "a": Group(None, 4, 1, 8), "b": Group(None, 2, 2, 3)}
    cap = capacity.plan(same, capacity.bytes_for(same, 2, tokens), 2)
    assert cap.tokens >= tokens
    assert cap.blocks["a"] * 4 >= tokens and cap.blocks["b"] * 4 >= tokens


@pytest.mark.parametrize("groups, tokens", [
    # 70 bytes / (3 + 5/3) bytes per token = 14.999... -> 14 tokens, 14 pages of x.
    ({"x": Group(None, 1, 1, 3), "y": Group(None, 3, 1, 5)}, 15),
    # 14 bytes / 2 bytes per token = 7 tokens -> x gets 7 // 4 = 1 page: 4 tokens < 5.
    ({"x": Group(None, 4, 1, 4), "y": Group(None, 6, 1, 6)}, 5),
])
def test_plan_of_bytes_for_holds_the_tokens_with_unequal_pages(groups, tokens):
    cap = capacity.plan(groups, capacity.bytes_for(groups, 1, tokens), 1)
    for name, group in groups.items():
        assert cap.blocks[name] * group.rows_per_page * group.tokens_per_row >= tokens
