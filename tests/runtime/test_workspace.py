"""The memory plan's workspace (runtime/planning/memory_plan.py `workspace`) is an estimate
from the shapes; the rehearsal measures what the launches allocate. For every shipped spec
the estimate must cover the measured peak and stay within 1.25 times it: a plan that
refuses a deployment that fits, or packs one that does not, fails here.

The launches measured are the ones that set the peak: every decode layout at the deepest
context bucket and one step of the main prefill there (its steps all have the same shapes:
a longer extent walks more of them, one at a time)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import generated
from runtime.device.rehearsal import Rehearsal
from runtime.planning.memory_plan import workspace


def _measured(name: str) -> int:
    spec = generated.load(name)
    c = spec.contract
    played = Rehearsal(spec, k=max(c.DECODE_LAYOUTS), device="cuda")
    done = list(played.launches(prefill_extent=c.TILE, contexts=(c.CONTEXT_BUCKETS[-1],)))
    assert [d.error for d in done] == [None] * len(done)
    return max(d.peak_bytes for d in done)


def _estimated(name: str) -> int:
    spec = generated.load(name)
    return workspace(spec, SimpleNamespace(max_model_len=spec.contract.CONTEXT_BUCKETS[-1]))


def _check(name: str) -> None:
    measured, estimated = _measured(name), _estimated(name)
    assert measured <= estimated <= 1.25 * measured, (name, measured, estimated)


@pytest.mark.parametrize("name", ["tiny", "reference"])
def test_the_estimate_covers_the_measured_peak_closely(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_the_estimate_covers_the_measured_peak_closely_at_full_size(name):
    _check(name)
