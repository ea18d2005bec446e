"""The persistent block tables: after every step of a real scheduler (admissions,
growth, preemptions and re-admissions, finishes and slot reuse), each scheduled
request's row equals its block lists padded with -1, while what was uploaded is only the
ids that were new; a launch's gathered tables are its rows' rows, -1 elsewhere."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import torch

from runtime.device.block_tables import BlockTables
from runtime.device.upload import Uploads
from tests.runtime.test_scheduler import add, make, model

WIDTH = {"kv": 16, "ring": 2}
SLOTS = 4


def _tables(ranks: int, device: str = "cpu") -> BlockTables:
    groups = {g: SimpleNamespace(table_width=w) for g, w in WIDTH.items()}
    return BlockTables(groups, ranks, SLOTS, torch.device(device))


def _expected(request, group: str) -> list[int]:
    ids = request.blocks[group]
    return ids + [-1] * (WIDTH[group] - len(ids))


def _scheduled(out):
    return [r for launch in out.decode for r in launch] + [ch.request for ch in out.prefill]


def test_rows_follow_the_scheduler_through_preemption_and_slot_reuse():
    rng = random.Random(0)
    s = make(ranks=2, kv=24, ring=8, slots=SLOTS, max_num_seqs=8)
    tables, checked = _tables(2), 0
    for _ in range(300):
        if rng.random() < 0.3:
            add(s, rng.randint(1, 20), max_tokens=rng.randint(1, 30))
        out = s.schedule()
        scheduled = _scheduled(out)
        tables.update(scheduled)
        for r in scheduled:
            for group in WIDTH:
                assert tables.table[group][r.rank, r.slot].tolist() == _expected(r, group)
                checked += 1
        s.commit(out, model(out))
    assert checked > 500 and s.num_preemptions > 0


def test_a_known_row_uploads_only_its_new_ids():
    s = make(ranks=1, kv=64, ring=16, slots=SLOTS, max_model_len=64)
    [request] = add(s, 8, max_tokens=40)
    tables = _tables(1, "meta")            # values are not needed: only what is sent
    sizes = []
    while not request.finished:
        out = s.schedule()
        held = sum(len(ids) for ids in request.blocks.values())
        with Uploads() as uploads:
            tables.update(_scheduled(out))
        sizes.append((held, uploads.bytes))
        s.commit(out, model(out))
    # the first step writes the new owner's row (its slot, then its ids); after that each
    # upload is 4 int64 (rank, slot, column, id) per id gained, whatever is held
    first, *later = [(held, n) for held, n in sizes if n]
    assert first[1] == 2 * 8 + 4 * 8 * first[0]
    assert len(later) >= 3 and all(n == 4 * 8 for _, n in later)
    assert max(held for held, _ in sizes) > 8


def test_a_launch_gathers_its_rows_and_scratch_elsewhere():
    s = make(ranks=2, kv=64, ring=16, slots=SLOTS)
    requests = add(s, 9, 5, 13)
    out = s.schedule()
    tables = _tables(2)
    tables.update(_scheduled(out))
    rows = [(r.rank, i, r) for i, r in enumerate(requests)]
    gathered = tables.gather(tables.slots(rows, 3))
    for group in WIDTH:
        table = gathered[f"block_table_{group}"]
        assert table.shape == (2, 3, WIDTH[group])
        expected = np.full((2, 3, WIDTH[group]), -1)
        for rank, row, r in rows:
            expected[rank, row] = _expected(r, group)
        assert table.tolist() == expected.tolist()
