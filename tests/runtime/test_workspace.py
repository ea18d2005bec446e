"""The memory plan's workspace (runtime/planning/memory_plan.py `workspace`) is an estimate
from the shapes; the rehearsal measures what the launches allocate. The estimate must
cover the measured peak and stay within 1.25 times it (bench/workspace.py says which
launches set the peak). The small specs are checked here; the full-size ones take minutes
of fake tensors each and are measured by `bench/workspace.py`."""
from __future__ import annotations

import pytest

from bench.workspace import MARGIN, covers, estimated, measured


@pytest.mark.parametrize("name", ["tiny", "reference"])
def test_the_estimate_covers_the_measured_peak_closely(name):
    got, want = measured(name), estimated(name)
    assert covers(got, want), (name, got, want, MARGIN)


def test_the_bound_refuses_an_estimate_under_the_peak_or_far_over_it():
    assert covers(100, 100) and covers(100, 125)
    assert not covers(100, 99) and not covers(100, 126)
