"""Pools are the only per-request state: reused pages leak nothing, and requests that
share a launch do not see each other."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_pools
from tests.model.support import REF, Driver, golden, reference_params

C = REF.contract


@pytest.fixture(scope="module")
def params():
    return reference_params()


def test_short_prompt_after_a_long_one_on_the_same_pages(params):
    """The official code never resets compressor state between sequences; here a page
    handed to a new request holds the old request's rows and must not matter."""
    long_case, short_case = golden()[-1], golden()[1]
    fresh, _ = Driver(params).prefill(short_case["prompt_ids"], 8192)
    driver = Driver(params)
    driver.prefill(long_case["prompt_ids"] + long_case["greedy_ids"], 128)
    assert any(t.abs().sum() > 0 for t in driver.pools.csa_state)  # stale state is there
    reused, _ = driver.prefill(short_case["prompt_ids"], 8192)
    assert torch.equal(reused, fresh)


def test_requests_sharing_a_launch_match_their_solo_runs(params):
    cases = golden()
    placements = [(0, 0), (0, 3), (5, 1), (7, 2)]
    prompts = [cases[i]["prompt_ids"] for i in (2, 3, 5, 7)]
    solo = [Driver(params, r, s).prefill(p, 8192)[0][-1] for (r, s), p in zip(placements, prompts)]

    pools = allocate_pools(REF, {g: Driver.BLOCKS * 2 for g in REF.pools.GROUPS})
    extent = C.dispatch_extent(max(len(p) for p in prompts))
    tokens = np.zeros((C.RANKS, C.SLOTS_PER_RANK, extent), np.int64)
    lens = np.zeros((C.RANKS, C.SLOTS_PER_RANK), np.int32)
    tables = {g: np.full((C.RANKS, C.SLOTS_PER_RANK, grp.table_width), -1, np.int32)
              for g, grp in REF.pools.GROUPS.items()}
    for i, ((r, s), p) in enumerate(zip(placements, prompts)):
        tokens[r, s, : len(p)], lens[r, s] = p, len(p)
        for g, grp in REF.pools.GROUPS.items():   # disjoint blocks: the first two on rank 0
            width = min(grp.table_width, Driver.BLOCKS)
            tables[g][r, s, :width] = np.arange(width) + (Driver.BLOCKS if i == 1 else 0)
    out = Launcher(REF.kernels.PREFILL_MAIN, backend="torch").launch(
        token_ids=tokens, start_pos=np.zeros_like(lens), chunk_lens=lens, extent=extent,
        pools=pools, weights=params, **{f"block_table_{g}": t for g, t in tables.items()})
    for (r, s), want in zip(placements, solo):
        assert (out.logits[r, s] - want).abs().max() <= 1e-5
