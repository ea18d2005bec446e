"""The O(1) snapshots a RequestOutput is made of: IdsSnapshot (its output_ids, a view of
an append-only list) and TextSnapshot (its text, a view of a GrowingText). Each reads as
the list or str it stands for and keeps its value while what is under it grows."""
from __future__ import annotations

import json
import random

import pytest

from runtime.engine.ids_snapshot import IdsSnapshot
from runtime.text.growing_text import CHUNK, GrowingText


def test_an_ids_snapshot_reads_as_the_list_it_was_taken_of():
    ids = [5, 6, 7, 8]
    view = IdsSnapshot(ids)
    ids += [9, 10]                      # the list grows; the view does not
    assert len(view) == 4 and list(view) == [5, 6, 7, 8] and repr(view) == "[5, 6, 7, 8]"
    assert (view[0], view[-1], view[-4]) == (5, 8, 5)
    for index in (4, -5):
        with pytest.raises(IndexError):
            view[index]
    assert view[1:] == [6, 7, 8] and view[:-1] == [5, 6, 7] and view[3:1] == []
    assert view[::-1] == [8, 7, 6, 5] and view[::2] == [5, 7] and view[-10:10] == [5, 6, 7, 8]
    assert 8 in view and 9 not in view and view.index(7) == 2 and view.count(5) == 1
    assert list(reversed(view)) == [8, 7, 6, 5]


def test_an_ids_snapshot_compares_adds_and_encodes_as_a_list():
    ids = [1, 2, 3]
    view = IdsSnapshot(ids, 2)
    assert view == [1, 2] == view and view == (1, 2) and view == IdsSnapshot([1, 2, 4], 2)
    assert view != [1, 2, 3] and view != [1, 3] and view != "12" and view != {1, 2}
    assert [0] + view == [0, 1, 2] and view + [7] == [1, 2, 7] and view + view == [1, 2, 1, 2]
    assert json.dumps(list(view)) == "[1, 2]"
    with pytest.raises(TypeError):
        hash(view)


def test_text_snapshots_keep_their_value_while_the_text_grows():
    rng = random.Random(0)
    text, whole, taken = GrowingText(), "", []
    for _ in range(2000):
        piece = "".join(rng.choice("ab é🎉\n") for _ in range(rng.randint(0, 9)))
        text.append(piece)
        whole += piece
        if rng.random() < 0.1:
            taken.append((text.snapshot(), whole))
    assert len(whole) > 3 * CHUNK and str(text) == whole and len(text) == len(whole)
    for snapshot, value in taken:
        assert str(snapshot) == value == snapshot and len(snapshot) == len(value)
    assert repr(taken[0][0]) == repr(taken[0][1])
