"""Fake cuda and npu devices on this CPU build of torch (runtime/device/fake_device.py):
the routed Tensor bindings mean what torch's mean, fake tensors on either device run the
ops a launch uses, and a tensor left on the host fails a rehearsed launch as it would
on the hardware."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import generated
from runtime.device.fake_device import _Unguarded, fake_device
from tests.conftest import REPO

KEYS = [1, -1, slice(1, 3), (slice(None), 2), (None, 0), (Ellipsis, 1), (0, Ellipsis, None),
        (slice(None, None, 2), slice(1, None)), torch.tensor([2, 0]), [0, 2],
        (slice(None), torch.tensor([1, 1])), (torch.tensor([0, 1]), torch.tensor([2, 3])),
        (1, slice(None), torch.tensor([0, 2])), torch.tensor([True, False, True])]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_indexing_routed_means_what_torch_means(key):
    x = torch.arange(3 * 4 * 5, dtype=torch.float32).view(3, 4, 5)
    want = x[key]
    with _Unguarded():
        got = x[key]
    torch.testing.assert_close(got, want)

    value = torch.full_like(want, -1.0) if want.dim() else -1.0
    expected, routed = x.clone(), x.clone()
    expected[key] = value
    with _Unguarded():
        routed[key] = value
    torch.testing.assert_close(routed, expected)


def test_to_and_copy_routed_mean_what_torch_means():
    x = torch.arange(6, dtype=torch.float32).view(2, 3)
    with _Unguarded():
        assert x.to(torch.float32) is x and x.to("cpu") is x
        assert x.to(torch.bfloat16).dtype == torch.bfloat16
        assert x.to("cpu", copy=True) is not x
        y = torch.zeros(2, 3).copy_(x.int())
        assert (~(x > 2)).tolist() == [[True, True, True], [False, False, False]]
        assert x.t().contiguous().is_contiguous()
    torch.testing.assert_close(y, x)


def test_fake_cuda_tensors_take_the_ops_a_launch_uses():
    from runtime.backends.compiled import moe

    with fake_device("cuda") as device, FakeTensorMode():
        x = torch.zeros(6, 8).to(device)                     # a host tensor moved
        x[1:3] = torch.ones(2, 8, device=device)
        picked = x[torch.tensor([0, 5], device=device)]
        w = torch.zeros(3, 8, 4, dtype=torch.bfloat16, device=device)
        offs = torch.tensor([2, 2, 6], dtype=torch.int32).to(device)
        out = moe._masked_mm(x.to(torch.bfloat16), w, offs)   # the capturable fallback
        assert (picked.device, out.device, out.shape) == (device, device, (6, 4))
        assert str(device) == "cuda:0"


def test_a_host_tensor_in_a_launch_fails_it_on_fake_cuda(monkeypatch):
    from runtime.backends.compiled import kernels
    from runtime.device.rehearsal import Rehearsal

    def stray(model, kernel, args, *rest):
        return torch.ones(4, device=args.token_ids.device) + torch.ones(4)   # host

    ref = generated.load("reference")
    monkeypatch.setitem(kernels.BY_KIND, "decode", stray)
    done = Rehearsal(ref, k=0, device="cuda").run(ref.kernels.DECODE_BY_K[0], 1024)
    assert done.peak_bytes is None
    assert "cuda:0" in done.error and "cpu" in done.error, done.error


# npu renames torch's privateuse1 device for the whole process: in a process of its own
NPU = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from runtime.backends.compiled import moe
from runtime.device.fake_device import fake_device
with fake_device("npu") as device, FakeTensorMode():
    x = torch.zeros(6, 8, dtype=torch.bfloat16).to(device)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32).to(device)
    out = moe._masked_mm(x, torch.zeros(3, 8, 4, dtype=torch.bfloat16, device=device), offs)
    assert out.device == device and str(device) == "npu:0", out.device
"""


@pytest.mark.slow
def test_npu_runs_the_moe_fallback_and_every_launch_kind():
    done = subprocess.run([sys.executable, "-c", NPU], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-m", "server.cli", "rehearse", "--spec",
                           "reference", "--device", "npu", "--prefill-extent", "128",
                           "--contexts", "4096"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "on a fake npu" in done.stdout and "FAILED" not in done.stdout
