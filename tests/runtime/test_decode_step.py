"""A step's decode launches laid out at once (runtime/device/decode_step.py): over the
steps of a real scheduler (admissions, growth, preemptions, finishes), every launch's
inputs equal what its requests say, row by row: a request's row is its index among its
rank's requests in the launch, its token, position, slot and generation sit there, the
tables gathered are its block lists (-1 elsewhere), the live rows and the output rows
are its flat index."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from runtime.device.decode_step import DecodeStep
from tests.runtime.test_block_tables import SLOTS, WIDTH, _expected, _scheduled, _tables
from tests.runtime.test_scheduler import add, make, model

RANKS, BATCH, TILE = 2, 2, 8


def _rows(launch) -> dict:
    """Each request's row, counted the plain way."""
    rows, seen = {}, {}
    for request in launch:
        rows[request] = seen.get(request.rank, 0)
        seen[request.rank] = rows[request] + 1
    return rows


def _check_launch(step: DecodeStep, i: int, launch, k: int) -> None:
    rows = _rows(launch)
    assert step.requests_of(i) == launch
    tokens, slots = step.tokens(i), step.slots(i)
    common = step.common(i)
    width = {g: WIDTH[g] for g in WIDTH}
    expected = {
        "token_ids": np.zeros((RANKS, BATCH, 1)), "positions": np.zeros((RANKS, BATCH)),
        "row_lens": np.zeros((RANKS, BATCH)), "slot_ids": np.full((RANKS, BATCH), -1),
        "slot_gens": np.zeros((RANKS, BATCH)),
        **{f"block_table_{g}": np.full((RANKS, BATCH, w), -1) for g, w in width.items()}}
    for r, row in rows.items():
        expected["token_ids"][r.rank, row, 0] = r.tail
        expected["positions"][r.rank, row] = r.num_tokens - 1
        expected["row_lens"][r.rank, row] = 1
        expected["slot_ids"][r.rank, row] = r.slot
        expected["slot_gens"][r.rank, row] = r.slot_generation
        for g in width:
            expected[f"block_table_{g}"][r.rank, row] = _expected(r, g)
    got = {**tokens, **slots, **{n: t.numpy() for n, t in common.items()
                                  if n.startswith("block_table_")}}
    for name, want in expected.items():
        assert got[name].tolist() == want.tolist(), name
    flat = [r.rank * BATCH + rows[r] for r in launch]
    assert common["live"].tolist() == sorted(flat)
    assert common["context"] == (max(r.num_tokens for r in launch) + k if launch else TILE)
    assert step.outputs(i).tolist() == flat
    kept = list(range(0, len(launch), 2))
    assert step.outputs(i, kept).tolist() == [flat[j] for j in kept]
    assert step.rows(i, kept) == [rows[launch[j]] for j in kept]


@pytest.mark.parametrize("k", [0, 1])
def test_every_launch_of_every_step_holds_its_requests_rows(k):
    rng = random.Random(k)
    s = make(ranks=RANKS, kv=24, ring=8, slots=SLOTS, max_num_seqs=8, decode_batch=BATCH)
    tables, launches = _tables(RANKS), 0
    for _ in range(200):
        if rng.random() < 0.3:
            add(s, rng.randint(1, 20), max_tokens=rng.randint(1, 30))
        out = s.schedule()
        tables.update(_scheduled(out))
        step = DecodeStep(out.decode, BATCH, RANKS, tables, k, TILE, torch.device("cpu"))
        assert len(step) == len(out.decode)
        for i, launch in enumerate(out.decode):
            _check_launch(step, i, launch, k)
            launches += 1
        s.commit(out, model(out))
    assert launches > 100 and s.num_preemptions > 0


def test_a_step_without_decode_launches_sends_nothing():
    step = DecodeStep([], BATCH, RANKS, _tables(RANKS), 0, TILE, torch.device("cpu"))
    assert len(step) == 0 and step.requests == []


def test_a_launch_without_rows_here_reads_scratch():
    """A rank worker takes part in every launch, its own rows or none."""
    tables = _tables(RANKS)
    step = DecodeStep([[]], BATCH, RANKS, tables, 0, TILE, torch.device("cpu"))
    common = step.common(0)
    assert common["context"] == TILE and common["live"].tolist() == []
    assert (common["block_table_kv"] == -1).all()
    assert step.tokens(0)["row_lens"].sum() == 0 and step.outputs(0).numel() == 0
