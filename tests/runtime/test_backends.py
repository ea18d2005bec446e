"""The backend registry and the dry-run backend's launch checks."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import generated
from contract.abi import ABIError
from runtime.backends import (
    Backend,
    get_backend,
    register_backend,
    supported_backends,
    unregister_backend,
)
from runtime.backends.dryrun import DryRunBackend
from runtime.backends.torch_backend import TorchBackend
from runtime.core.config import EngineConfig
from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_pools
from runtime.engine.engine import _check_executor
from runtime.executor.executor import backend_name
from runtime.planning.admission import ConfigError

tiny = generated.load("tiny")


def _prefill_kwargs(extent=256, **override):
    c = tiny.contract
    shape = (c.RANKS, c.SLOTS_PER_RANK)
    kwargs = dict(token_ids=np.zeros(shape + (extent,), np.int64),
                  start_pos=np.zeros(shape, np.int32), chunk_lens=np.full(shape, extent, np.int32),
                  pools=allocate_pools(tiny, {n: 4 for n in tiny.pools.GROUPS}),
                  weights=type("W", (), {"fingerprint": tiny.architecture.FINGERPRINT})(),
                  extent=extent,
                  **{f"block_table_{n}": np.full(shape + (g.table_width,), -1, np.int32)
                     for n, g in tiny.pools.GROUPS.items()})
    kwargs.update(override)
    return kwargs


def test_unknown_backend_lists_the_supported_ones():
    with pytest.raises(KeyError, match=r"unknown kernel backend 'cutlass'; supported: .*dryrun"):
        get_backend("cutlass")


def test_generated_load_names_the_known_specs():
    with pytest.raises(KeyError, match="no generated package for spec 'v5'"):
        generated.load("v5")
    assert generated.load("deepseek-v4-flash").contract.MAX_EXTENT == 8192
    assert generated.load("specs/tiny.yaml") is generated.load("tiny")


def test_wrappers_launch_through_the_registered_backend():
    seen = []

    class Recorder:
        name = "recorder"

        def launch(self, kernel, args):
            seen.append((kernel.name, kernel.kind, args._fields, args.host["chunk_lens"]))

    register_backend("recorder", Recorder)
    assert "recorder" in supported_backends()
    Launcher(tiny.kernels.PREFILL_MAIN, backend="recorder").launch(**_prefill_kwargs())
    [(name, kind, fields, lens)] = seen
    assert (name, kind) == ("prefill_main", "prefill_main")
    assert fields == (*(a.name for a in tiny.kernels.PREFILL_MAIN.args), "host", "live")
    assert lens.shape == (8, 4) and (lens == 256).all()   # the host copy of the metadata


def test_dryrun_counts_launches():
    backend = DryRunBackend()
    register_backend("dryrun-counting", lambda: backend)
    Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun-counting").launch(**_prefill_kwargs())
    assert backend.launches == {"prefill_main": 1}


def test_dryrun_rejects_block_ids_outside_the_pool():
    kwargs = _prefill_kwargs()
    kwargs["block_table_cmp_c4"][2, 1, 0] = 4  # the pool has blocks 0..3
    with pytest.raises(ABIError, match=r"block_table_cmp_c4 holds ids outside \[-1, 4\)"):
        Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun").launch(**kwargs)


def test_dryrun_rejects_rows_longer_than_the_extent():
    kwargs = _prefill_kwargs(extent=128)
    kwargs["chunk_lens"][0, 0] = 129
    with pytest.raises(ABIError, match=r"chunk_lens must lie in \[0, 128\]"):
        Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun").launch(**kwargs)


@pytest.mark.parametrize("extent", [0, 100, 8192 + 128, True])
def test_extent_must_be_a_tile_multiple_within_the_maximum(extent):
    with pytest.raises(ABIError, match="must be a multiple of the tile 128"):
        wrapper = Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun")
        wrapper.marshal(**{**_prefill_kwargs(), "extent": extent})


def test_tensors_are_not_silently_cast():
    import torch

    kwargs = _prefill_kwargs(start_pos=torch.zeros((8, 4), dtype=torch.int64))
    with pytest.raises(ABIError, match="start_pos: dtype torch.int64, expected torch.int32"):
        Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun").marshal(**kwargs)


def test_every_decode_layout_marshals_its_own_shapes():
    for k, layout in tiny.contract.DECODE_LAYOUTS.items():
        wrapper = Launcher(tiny.kernels.DECODE_BY_K[k], backend="dryrun")
        assert wrapper.kernel.class_name == f"DecodeB{layout.batch}S{layout.seq}"
        args = wrapper.kernel.args
        assert args[-1].name == ("draft_ids" if k else "logits")
        assert args[0].shape[:2] == ("ranks", layout.batch)
        assert (wrapper.slot_ids if k else wrapper.token_ids).shape[0] == tiny.contract.RANKS


def test_a_wrapper_drives_the_ranks_it_was_built_for():
    one = Launcher(tiny.kernels.PREFILL_MAIN, backend="dryrun", ranks=1)
    kwargs = _prefill_kwargs()
    kwargs = {name: value[:1] if isinstance(value, np.ndarray) else value
              for name, value in kwargs.items()}
    kwargs["pools"] = allocate_pools(tiny, {n: 4 for n in tiny.pools.GROUPS}, ranks=1)
    args = one.marshal(**kwargs)
    assert args.token_ids.shape == (1, 4, 256) and args.pool_ori.shape[0] == 1
    with pytest.raises(ABIError, match="pool_ori: shape"):
        one.marshal(**{**kwargs, "pools": allocate_pools(tiny, {n: 4 for n in tiny.pools.GROUPS})})


class Delegating(Backend):
    """A backend defined outside runtime/backends/: counts its launches by kernel kind
    and runs them on the torch backend. Every capability stays at Backend's default."""

    name = "delegating"

    def __init__(self):
        self.inner, self.kinds = TorchBackend(), Counter()

    def launch(self, kernel, args) -> None:
        self.kinds[kernel.kind] += 1
        self.inner.launch(kernel, args)


@pytest.fixture
def delegating():
    register_backend(Delegating.name, Delegating)
    try:
        yield get_backend(Delegating.name)
    finally:
        unregister_backend(Delegating.name)
    assert Delegating.name not in supported_backends()


def test_a_registered_backend_runs_a_launch_through_a_wrapper(delegating):
    from tests.model.support import REF, reference_params

    params, c = reference_params(), REF.contract
    shape = (c.RANKS, c.SLOTS_PER_RANK)
    lens = np.zeros(shape, np.int32)
    lens[0, 0] = 5
    tokens = np.zeros(shape + (c.TILE,), np.int64)
    tokens[0, 0, :5] = [5, 6, 7, 8, 9]
    out = Launcher(REF.kernels.PREFILL_MAIN, backend="delegating").launch(
        token_ids=tokens, start_pos=np.zeros(shape, np.int32), chunk_lens=lens, extent=c.TILE,
        pools=allocate_pools(REF, {n: 4 for n in REF.pools.GROUPS}), weights=params,
        **{f"block_table_{n}": np.full(shape + (g.table_width,), -1, np.int32)
           for n, g in REF.pools.GROUPS.items()})
    assert delegating.kinds == {"prefill_main": 1}
    assert out.logits[0, 0].abs().sum() > 0 and not out.logits[0, 1].any()   # row 1: empty


@pytest.mark.parametrize("k", [0, 1])
def test_an_engine_runs_on_a_registered_backend(delegating, k):
    from tests.model.support import reference_params
    from tests.runtime.engine_support import GREEDY, make_engine

    params, prompts = reference_params(), [[5, 6, 7, 8], list(range(3, 40))]
    engine = make_engine(params, backend="delegating", num_speculative_tokens=k)
    assert engine.summary()["backend"] == "delegating" and engine.warmup() == {}
    got = [o.output_ids for o in engine.generate(prompts, GREEDY)]
    torch_engine = make_engine(params, backend="torch", num_speculative_tokens=k)
    assert got == [o.output_ids for o in torch_engine.generate(prompts, GREEDY)]
    kinds = {"prefill_main", "decode_mtp" if k else "decode"} | ({"prefill_mtp"} if k else set())
    assert set(delegating.kinds) == kinds
    assert engine.graph_info() == {"mode": "eager", "compiled": {}, "pending": 0}


def test_the_engine_reads_a_backends_capabilities(delegating):
    from tests.model.support import REF, reference_params
    from tests.runtime.engine_support import make_engine

    eager = EngineConfig(spec="reference", backend="delegating", enforce_eager=True)
    assert backend_name(eager, REF) == "delegating"           # no eager variant: itself
    assert backend_name(EngineConfig(backend="compiled", enforce_eager=True), REF) \
        == "compiled-eager"
    with pytest.raises(ConfigError, match="'delegating' backend runs in one process only"):
        _check_executor(EngineConfig(backend="delegating", distributed_executor_backend="mp"),
                        REF)
    engine = make_engine(reference_params(), backend="delegating", defer_compile=True)
    assert delegating.defer and not engine.executor.compiles()
