"""The rehearsal runs every launch kind of a spec on fake tensors and a fake group of its
ranks, measures each launch's peak, and names a launch that fails. CI rehearses the
reference spec (the fixture's architecture, few layers); `v4serve rehearse --spec
deepseek-v4-flash` is the full-size one (README)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import generated
from runtime.device.rehearsal import Rehearsal
from tests.conftest import REPO

REF = generated.load("reference")


@pytest.fixture(scope="module")
def done():
    return list(Rehearsal(REF, device="cuda").launches(prefill_extent=REF.contract.TILE))


def test_every_launch_kind_runs_at_every_context(done):
    assert [d.error for d in done] == [None] * len(done)
    c = REF.contract
    decode = [(d.kernel, d.context) for d in done if d.kernel.startswith("decode")]
    assert c.DEFAULT_NUM_SPECULATIVE_TOKENS > 0          # so the K=0 twin that keeps slots
    kernels = [name for k in sorted(c.DECODE_LAYOUTS) if k <= c.DEFAULT_NUM_SPECULATIVE_TOKENS
               for name in (c.DECODE_LAYOUTS[k].kernel,
                            *([c.DECODE_LAYOUTS[k].kernel + "_mtp"] if k == 0 else []))]
    assert decode == [(name, ctx) for name in kernels for ctx in c.CONTEXT_BUCKETS]
    assert [d.kernel for d in done[-2:]] == ["prefill_main", "prefill_mtp"]
    assert [d.kernel for d in done if d.context == 0] == ["sample", "verify"]


def test_each_launch_has_a_measured_peak(done, monkeypatch):
    import torch

    from runtime.backends.compiled import kernels

    assert all(d.peak_bytes > 0 for d in done)

    def workspace(*args, **kwargs):            # 64 GiB that exist only as a shape
        torch.empty(64 << 30, dtype=torch.uint8).fill_(0)

    monkeypatch.setitem(kernels.BY_KIND, "decode", workspace)
    big = Rehearsal(REF, k=0).run(REF.kernels.DECODE_BY_K[0], 1024)
    assert 64 << 30 <= big.peak_bytes < (64 << 30) + (64 << 20)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_the_peak_tracker_measures_what_memtracker_measures(kind):
    """Both trackers around one launch: the same peak (MemTracker rounds nothing away
    that matters: within 1%)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from runtime.backends.compiled import expert_parallel
    from runtime.device import rehearsal
    from runtime.device.peak_tracker import PeakTracker

    played = Rehearsal(REF, k=0, device="cuda")
    kernel = REF.kernels.DECODE_BY_K[0] if kind == "decode" else REF.kernels.PREFILL_MAIN
    extent = None if kind == "decode" else 2 * REF.contract.TILE
    with (rehearsal._FakeGroup(REF.contract.RANKS, 0), rehearsal.fake_device("cuda"),
          played.mode):
        launcher = rehearsal.Launcher(kernel, played.device, backend="compiled-eager",
                                      ranks=1)
        given = played._inputs(kernel, REF.contract.CONTEXT_BUCKETS[-1], extent)
        known = rehearsal._tensors((played.params, played.pools, launcher.buffers, given))
        ours, theirs = PeakTracker(known), MemTracker()
        theirs.track_external(*known)
        with theirs:
            before = max(v["Total"] for v in theirs.get_tracker_snapshot("current").values())
            with ours, expert_parallel.fixed_rows():
                launcher.launch(**given)
        peak = max(v["Total"] for v in theirs.get_tracker_snapshot("peak").values()) - before
    assert ours.peak > 1 << 20
    assert abs(ours.peak - peak) <= 0.01 * peak, (ours.peak, peak)


def test_a_failing_launch_is_named_with_its_error(monkeypatch):
    from runtime.backends.compiled import kernels

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setitem(kernels.BY_KIND, "decode", broken)
    failed = Rehearsal(REF, k=0).run(REF.kernels.DECODE_BY_K[0], 1024)
    assert failed.peak_bytes is None
    assert failed.error == "RuntimeError: mat1 and mat2 shapes cannot be multiplied"


@pytest.mark.slow
def test_v4serve_rehearse_prints_a_line_per_launch_and_fails_on_none():
    done = subprocess.run([sys.executable, "-m", "server.cli", "rehearse", "--spec",
                           "reference", "--prefill-extent", "128", "--contexts", "4096",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    launches = [json.loads(line) for line in done.stdout.splitlines()]
    assert [x["kernel"] for x in launches] == ["decode_b8s1", "decode_b8s1_mtp", "sample",
                                               "decode_b4s2", "verify", "prefill_main",
                                               "prefill_mtp"]
    assert all(x["error"] is None and x["peak_bytes"] > 0 for x in launches)


def test_a_replica_of_other_ranks_splits_the_experts_over_them():
    experts = REF.architecture.CONFIG["n_routed_experts"]
    played = Rehearsal(REF, rank=3, k=0, device="cuda", ranks=4)
    assert played.params.experts[0].tensors()[0].shape[0] == experts // 4
    done = played.run(REF.kernels.DECODE_BY_K[0], 4096)
    assert done.error is None and done.peak_bytes > 0
    with pytest.raises(ValueError, match="split evenly"):
        Rehearsal(REF, ranks=3)
    with pytest.raises(ValueError, match="ranks 0..3"):
        Rehearsal(REF, rank=4, ranks=4)


def test_a_sampler_that_reads_the_device_fails_its_launch(monkeypatch):
    from runtime.sampling import batch_sampler

    def reads(logits, *rest):
        return int(logits.argmax())                       # a host read of a device value

    monkeypatch.setattr(batch_sampler, "sample", reads)
    done = Rehearsal(REF, k=0, device="cuda").sample(REF.kernels.DECODE_BY_K[0])
    assert (done.kernel, done.peak_bytes) == ("sample", None) and done.error
