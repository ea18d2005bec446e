"""The memory plan's workspace estimate against the peak the launches allocate, per spec.

runtime/planning/memory_plan.py `workspace` estimates from the shapes the bytes a step's
launches allocate beyond the weights and pools; the rehearsal (runtime/device/rehearsal.py)
measures them on a fake cuda device. The launches measured are the ones that set the
peak: every decode layout at the deepest context bucket and one step of the main prefill
there (its steps all have the same shapes: a longer extent walks more of them, one at a
time). The estimate must cover the measured peak and stay within 1.25 times it: a plan
that refuses a deployment that fits, or packs one that does not, fails here.

The test suite checks the small specs (tests/runtime/test_workspace.py); the full-size
ones take minutes of fake tensors each (V4-Pro about 100 s, V4-Flash about 60 s on 2
cores), so they are measured here:

    .venv/bin/python bench/workspace.py [--specs deepseek-v4-flash,deepseek-v4-pro]

Prints measured and estimated bytes and their ratio per spec; exits 1 if any estimate is
outside [measured, 1.25 x measured].
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import generated  # noqa: E402
from runtime.device.rehearsal import Rehearsal  # noqa: E402
from runtime.planning.memory_plan import workspace  # noqa: E402

MARGIN = 1.25           # the estimate may exceed the measured peak by this factor at most
FULL_SIZE = ("deepseek-v4-flash", "deepseek-v4-pro")
GIB = 2**30


def measured(name: str) -> int:
    """The largest peak of the launches that set it, rehearsed on a fake cuda device."""
    spec = generated.load(name)
    c = spec.contract
    played = Rehearsal(spec, k=max(c.DECODE_LAYOUTS), device="cuda")
    done = list(played.launches(prefill_extent=c.TILE, contexts=(c.CONTEXT_BUCKETS[-1],)))
    failed = [d.error for d in done if d.error is not None]
    if failed:
        raise RuntimeError(f"{name}: a rehearsed launch failed: {failed[0]}")
    return max(d.peak_bytes for d in done)


def estimated(name: str) -> int:
    spec = generated.load(name)
    return workspace(spec, SimpleNamespace(max_model_len=spec.contract.CONTEXT_BUCKETS[-1]))


def covers(measured_bytes: int, estimated_bytes: int) -> bool:
    return measured_bytes <= estimated_bytes <= MARGIN * measured_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--specs", default=",".join(FULL_SIZE),
                        help="comma-separated spec names (default: the full-size ones)")
    names = parser.parse_args().specs.split(",")
    print(f"{'spec':<20} {'measured GiB':>13} {'estimated GiB':>14} {'ratio':>7} {'s':>6}")
    ok = True
    for name in names:
        start = time.perf_counter()
        got, want = measured(name), estimated(name)
        ok &= covers(got, want)
        print(f"{name:<20} {got / GIB:>13.3f} {want / GIB:>14.3f} {want / got:>7.3f} "
              f"{time.perf_counter() - start:>6.0f}"
              + ("" if covers(got, want) else f"  outside [1, {MARGIN}]"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
