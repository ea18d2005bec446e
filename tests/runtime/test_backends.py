"""The backend registry and the dry-run backend's launch checks."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import generated
from runtime.backends import get_backend, register_backend, supported_backends
from runtime.backends.dryrun import DryRunBackend
from runtime.device.abi import ABIError

tiny = generated.load("tiny")


def _prefill_kwargs(extent=256, **override):
    c = tiny.contract
    shape = (c.RANKS, c.SLOTS_PER_RANK)
    kwargs = dict(token_ids=np.zeros(shape + (extent,), np.int64),
                  start_pos=np.zeros(shape, np.int32), chunk_lens=np.full(shape, extent, np.int32),
                  pools=tiny.pools.allocate({n: 4 for n in tiny.pools.GROUPS}),
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
    tiny.kernels.PrefillMain(backend="recorder").launch(**_prefill_kwargs())
    [(name, kind, fields, lens)] = seen
    assert (name, kind) == ("prefill_main", "prefill_main")
    assert fields == (*(a.name for a in tiny.kernels.prefill_main.ARGS), "host")
    assert lens.shape == (8, 4) and (lens == 256).all()   # the host copy of the metadata


def test_dryrun_counts_launches():
    backend = DryRunBackend()
    register_backend("dryrun-counting", lambda: backend)
    tiny.kernels.PrefillMain(backend="dryrun-counting").launch(**_prefill_kwargs())
    assert backend.launches == {"prefill_main": 1}


def test_dryrun_rejects_block_ids_outside_the_pool():
    kwargs = _prefill_kwargs()
    kwargs["block_table_cmp_c4"][2, 1, 0] = 4  # the pool has blocks 0..3
    with pytest.raises(ABIError, match=r"block_table_cmp_c4 holds ids outside \[-1, 4\)"):
        tiny.kernels.PrefillMain(backend="dryrun").launch(**kwargs)


def test_dryrun_rejects_rows_longer_than_the_extent():
    kwargs = _prefill_kwargs(extent=128)
    kwargs["chunk_lens"][0, 0] = 129
    with pytest.raises(ABIError, match=r"chunk_lens must lie in \[0, 128\]"):
        tiny.kernels.PrefillMain(backend="dryrun").launch(**kwargs)


@pytest.mark.parametrize("extent", [0, 100, 8192 + 128, True])
def test_extent_must_be_a_tile_multiple_within_the_maximum(extent):
    with pytest.raises(ABIError, match="must be a multiple of the tile 128"):
        wrapper = tiny.kernels.PrefillMain(backend="dryrun")
        wrapper.marshal(**{**_prefill_kwargs(), "extent": extent})


def test_tensors_are_not_silently_cast():
    import torch

    kwargs = _prefill_kwargs(start_pos=torch.zeros((8, 4), dtype=torch.int64))
    with pytest.raises(ABIError, match="start_pos: dtype torch.int64, expected torch.int32"):
        tiny.kernels.PrefillMain(backend="dryrun").marshal(**kwargs)


def test_every_decode_layout_marshals_its_own_shapes():
    for k, layout in tiny.contract.DECODE_LAYOUTS.items():
        wrapper = tiny.kernels.DECODE_BY_K[k](backend="dryrun")
        assert type(wrapper).__name__ == f"DecodeB{layout.batch}S{layout.seq}"
        args = sys.modules[type(wrapper).__module__].ARGS
        assert args[-1].name == ("draft_ids" if k else "logits")
        assert args[0].shape[:2] == (None, layout.batch)       # None: the wrapper's ranks
        assert (wrapper.slot_ids if k else wrapper.token_ids).shape[0] == tiny.contract.RANKS


def test_a_wrapper_drives_the_ranks_it_was_built_for():
    one = tiny.kernels.PrefillMain(backend="dryrun", ranks=1)
    kwargs = _prefill_kwargs()
    kwargs = {name: value[:1] if isinstance(value, np.ndarray) else value
              for name, value in kwargs.items()}
    kwargs["pools"] = tiny.pools.allocate({n: 4 for n in tiny.pools.GROUPS}, ranks=1)
    args = one.marshal(**kwargs)
    assert args.token_ids.shape == (1, 4, 256) and args.pool_ori.shape[0] == 1
    with pytest.raises(ABIError, match="pool_ori: shape"):
        one.marshal(**{**kwargs, "pools": tiny.pools.allocate({n: 4 for n in tiny.pools.GROUPS})})
