"""The expert-parallel MoE on eight ranks: the static-shape path decode launches take
(all-gather, local experts, all-reduce) equals the all-to-all path and the local MoE, and
never reads a device value on the host nor makes a shape from one (what a CUDA graph
cannot capture): run under FakeTensorMode, where either raises."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.testing._internal.distributed.fake_pg import FakeStore

from runtime.backends.compiled import expert_parallel
from runtime.backends.compiled.moe import routed

RANKS, LOCAL, ROWS, TOP, DIM, INTER = 8, 2, 6, 3, 16, 12


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    """One rank's rows and routes, and every expert's weights (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, DIM, generator=gen)
    chosen = torch.stack([torch.randperm(RANKS * LOCAL, generator=gen)[:TOP]
                          for _ in range(ROWS)])
    weights = torch.rand(ROWS, TOP, generator=gen)
    gen = torch.Generator().manual_seed(1000)
    w13 = torch.randn(RANKS * LOCAL, 2 * INTER, DIM, generator=gen)
    w2 = torch.randn(RANKS * LOCAL, DIM, INTER, generator=gen)
    return x, chosen, weights, w13, w2


def _rank(rank: int, store: str, failures) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=RANKS)
    try:
        x, chosen, weights, w13, w2 = _inputs(rank)
        mine = slice(rank * LOCAL, (rank + 1) * LOCAL)
        group = dist.group.WORLD
        exchanged = expert_parallel.exchanged_moe(x, chosen, weights, w13[mine], w2[mine],
                                                  10.0, group)
        gathered = expert_parallel.gathered_moe(x, chosen, weights, w13[mine], w2[mine],
                                                10.0, group)
        local = routed(x, chosen, weights, w13, w2, 10.0)
        torch.testing.assert_close(gathered, exchanged, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gathered, local, rtol=1e-4, atol=1e-4)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        failures.put(f"rank {rank}: {exc}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_gathered_moe_equals_the_exchanged_and_the_local_one_on_eight_ranks(tmp_path):
    failures = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(str(tmp_path / "store"), failures), nprocs=RANKS,
                       start_method="spawn")
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert errors == []


@pytest.fixture
def fake_group():
    """A fake process group of RANKS ranks in this process (collectives do nothing)."""
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=RANKS)
    expert_parallel.enable(dist.group.WORLD)
    try:
        yield
    finally:
        expert_parallel.enable(None)
        dist.destroy_process_group()


def _fake_inputs() -> tuple[FakeTensorMode, tuple[torch.Tensor, ...]]:
    """Rank 3's inputs as fake tensors: their shapes and dtypes, no values to read."""
    x, chosen, weights, w13, w2 = _inputs(0)
    mode = FakeTensorMode()
    real = (x, chosen, weights, w13[:LOCAL].clone(), w2[:LOCAL].clone())
    return mode, tuple(mode.from_tensor(t) for t in real)


# The implementations themselves: the op's registered fake would stand in for them.
def test_the_decode_moe_never_syncs_with_the_host(fake_group):
    mode, inputs = _fake_inputs()
    with mode:
        out = expert_parallel.gathered_moe(*inputs, 10.0, dist.group.WORLD)
    assert out.shape == (ROWS, DIM)


def test_the_check_catches_the_all_to_all_moe_reading_its_splits(fake_group):
    mode, inputs = _fake_inputs()
    with mode, pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        expert_parallel.exchanged_moe(*inputs, 10.0, dist.group.WORLD)


def test_decode_launches_take_the_static_path(fake_group, monkeypatch):
    taken = []
    for path in ("gathered_moe", "exchanged_moe"):
        monkeypatch.setattr(expert_parallel, path,
                            lambda *a, path=path: taken.append(path) or a[0])
    x, chosen, weights, w13, w2 = _inputs(0)
    with expert_parallel.fixed_rows():
        expert_parallel.ep_moe(x, chosen, weights, w13[:LOCAL], w2[:LOCAL], 10.0, [])
    expert_parallel.ep_moe(x, chosen, weights, w13[:LOCAL], w2[:LOCAL], 10.0, [])
    assert taken == ["gathered_moe", "exchanged_moe"]


@pytest.mark.parametrize("path", ["_looped_mm", "_masked_mm"])
def test_the_grouped_matmul_fallbacks_use_each_experts_own_weights(path):
    from runtime.backends.compiled import moe

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(11, 8, generator=gen), torch.randn(3, 8, 5, generator=gen)
    offs = torch.tensor([2, 2, 9], dtype=torch.int32)       # expert 1 has no rows; 2 left
    want = torch.cat([a[:2] @ b[0], a[2:9] @ b[2], torch.zeros(2, 5)])
    torch.testing.assert_close(getattr(moe, path)(a, b, offs), want)


# npu is torch_npu's name for the privateuse1 device; here a process renames it so.
SELECT = """
import sys, torch
if sys.argv[1] == "npu":
    torch.utils.rename_privateuse1_backend("npu")
from runtime.executor import rank_worker
chosen = []
module = type("DeviceModule", (), {"set_device": staticmethod(chosen.append)})
torch.get_device_module = lambda device: module
device = rank_worker.device_of(sys.argv[1], 3)
rank_worker.select(device)
assert chosen == [device] and str(device) == sys.argv[1] + ":3", (chosen, device)
"""


@pytest.mark.parametrize("kind", ["cuda", "npu"])
def test_a_rank_worker_selects_its_device(kind):
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-c", SELECT, kind], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# -- whole decode launches ---------------------------------------------------------------
# A rank worker's decode launch (one rank, its share of the experts, the fake group of
# eight) or the single-process one (every rank, every expert), run under FakeTensorMode:
# the staged inputs are fake, so any read of a device value on the host, or a shape made
# from one, anywhere in the launch raises.

def _decode_launch(k: int, ep: bool) -> tuple:
    import numpy as np

    from runtime.device.launcher import Launcher
    from runtime.device.pools import allocate_mtp_state, allocate_pools
    from runtime.weights.loader import load_params
    from tests.model.support import FIXTURE, REF

    ranks = 1 if ep else REF.contract.RANKS
    params = load_params(FIXTURE, REF, held=range(3, 4) if ep else None)
    kernel = REF.kernels.DECODE_BY_K[k]
    rows, seq = kernel.rows, kernel.seq
    mode = FakeTensorMode(allow_non_fake_inputs=True)      # the weights stay real
    with mode:
        launcher = Launcher(kernel, backend="compiled-eager", ranks=ranks)
        given = {f"block_table_{g}": np.zeros((ranks, rows, group.table_width), np.int32)
                 for g, group in REF.pools.GROUPS.items()}
        given.update(pools=allocate_pools(REF, {g: 8 for g in REF.pools.GROUPS},
                                          ranks=ranks), weights=params, context=100)
    if k:
        words = (REF.architecture.CONFIG["vocab_size"] + 31) // 32
        given.update(slot_ids=np.zeros((ranks, rows), np.int32),
                     slot_gens=np.ones((ranks, rows), np.int64),
                     draft_mask=np.full((ranks, rows, words), -1, np.int32))
        with mode:
            given["mtp"] = allocate_mtp_state(REF, ranks=ranks)
    else:
        given.update(token_ids=np.ones((ranks, rows, seq), np.int64),
                     positions=np.full((ranks, rows), 50, np.int32),
                     row_lens=np.ones((ranks, rows), np.int32))
    return mode, launcher, given


@pytest.fixture
def fake_eight(request, monkeypatch):
    """Expert parallelism over a fake group of eight (this process is rank 3), or none.
    The layers call the MoE's implementation itself: under FakeTensorMode the operator
    would run its registered fake instead, which checks nothing."""
    if not request.param:
        yield False
        return
    from runtime.backends.compiled import forward

    monkeypatch.setattr(forward, "ep_moe", expert_parallel._ep_moe)
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=RANKS)
    expert_parallel.enable(dist.group.WORLD)
    try:
        yield True
    finally:
        expert_parallel.enable(None)
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("fake_eight", [False, True], indirect=True, ids=["uni", "ep8"])
@pytest.mark.parametrize("k", [0, 1])
def test_every_decode_launch_is_static(k, fake_eight):
    mode, launcher, given = _decode_launch(k, fake_eight)
    with mode:
        out = launcher.launch(**given)
    assert out.logits.shape[:2] == (launcher.ranks, launcher.kernel.rows)


@pytest.mark.slow
@pytest.mark.parametrize("fake_eight", [True], indirect=True, ids=["ep8"])
def test_the_launch_check_catches_a_decode_on_the_all_to_all_moe(fake_eight, monkeypatch):
    from contextlib import nullcontext

    monkeypatch.setattr(expert_parallel, "fixed_rows", nullcontext)
    mode, launcher, given = _decode_launch(0, fake_eight)
    with mode, pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        launcher.launch(**given)


def _packed_experts(gen: torch.Generator, experts: int, inter: int,
                    dim: int) -> tuple[torch.Tensor, ...]:
    """Random experts as a checkpoint holds them: packed FP4 w13 and w2, e8m0 scales."""
    def draw(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=gen, dtype=torch.uint8)

    return (draw(0, 256, experts, 2 * inter, dim // 2), draw(0, 256, experts, dim, inter // 2),
            draw(124, 130, experts, 2 * inter, dim // 32),
            draw(124, 130, experts, dim, inter // 32))


def test_packed_fp4_experts_give_what_their_dequantized_stacks_give():
    """The expert-parallel MoE takes the experts as held (packed FP4 and e8m0 scales) and
    dequantizes a third of them at a time: the whole stacks never exist at once."""
    from runtime.model import quant

    gen = torch.Generator().manual_seed(0)
    experts, inter, dim, rows, top = 4, 32, 64, 5, 2
    held = _packed_experts(gen, experts, inter, dim)
    x = torch.randn(rows, dim, generator=gen)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:top] for _ in range(rows)])
    weights = torch.rand(rows, top, generator=gen)
    w13, w2 = quant.stacks(held, torch.float32)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for moe in (expert_parallel.gathered_moe, expert_parallel.exchanged_moe):
            packed = moe(x, chosen, weights, *held[:2], 10.0, dist.group.WORLD, held[2:])
            whole = moe(x, chosen, weights, w13, w2, 10.0, dist.group.WORLD)
            torch.testing.assert_close(packed, whole)
            assert packed.abs().sum() > 0
    finally:
        dist.destroy_process_group()


def test_the_decode_moe_reads_each_pairs_experts_in_place():
    """moe.gathered (decode calls on a CPU) gives what the grouped matmuls give, with the
    experts held as float stacks or as packed FP4 and their scales."""
    from runtime.backends.compiled.moe import gathered
    from runtime.model import quant

    x, chosen, weights, w13, w2 = _inputs(3)
    torch.testing.assert_close(gathered(x, chosen, weights, (w13, w2), 10.0),
                               routed(x, chosen, weights, w13, w2, 10.0), rtol=1e-5, atol=1e-5)
    gen = torch.Generator().manual_seed(1)
    experts, inter, dim = 4, 32, 64
    held = _packed_experts(gen, experts, inter, dim)
    x = torch.randn(3, dim, generator=gen)
    chosen = torch.tensor([[0, 3], [3, 1], [2, 0]])
    weights = torch.rand(3, 2, generator=gen)
    packed = gathered(x, chosen, weights, held, 10.0)
    whole = routed(x, chosen, weights, *quant.stacks(held, torch.float32), 10.0)
    torch.testing.assert_close(packed, whole, rtol=1e-4, atol=1e-3)     # values ~1-10
    assert packed.abs().sum() > 0
