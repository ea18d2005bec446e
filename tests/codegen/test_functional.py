"""Functional: generate an inline spec with other shapes, import it, allocate, marshal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from codegen.pipeline import generate
from contract.abi import ABIError
from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_mtp_state, allocate_pools
from tests.conftest import import_fresh, replace_once

# Other shapes than any checked-in spec: 4 ranks, B8S2 for K=1, a 4096-row extent,
# 2 prefill slots, a shorter max_model_len.
EDITS = [
    ("  ranks: 8\n  dp: 8 ", "  ranks: 4\n  dp: 4 "),
    ("  ep: 8 ", "  ep: 4 "),
    ("  max_extent: 8192", "  max_extent: 4096"),
    ("  slots_per_rank: 4", "  slots_per_rank: 2"),
    ("{k: 1, batch: 4, seq: 2}", "{k: 1, batch: 8, seq: 2}"),
    ("  max_model_len: 16384", "  max_model_len: 4096"),
    ("  context_buckets: [1024, 4096, 16384]", "  context_buckets: [2048, 4096]"),
    ("  max_num_seqs: 64", "  max_num_seqs: 32"),
]


@pytest.fixture
def alt(tmp_path, tiny_text):
    text = tiny_text
    for old, new in EDITS:
        text = replace_once(text, old, new)
    spec = tmp_path / "specs" / "alt-shapes.yaml"
    spec.parent.mkdir()
    spec.write_text(text)
    generate([spec], tmp_path / "out", root=tmp_path, every=False)
    return import_fresh(tmp_path / "out", "alt_shapes")


class Weights:
    def __init__(self, fingerprint: str):
        self.fingerprint = fingerprint


def _tables(pkg, ranks: int, rows: int) -> dict[str, np.ndarray]:
    return {f"block_table_{name}": np.full((ranks, rows, group.table_width), -1, np.int32)
            for name, group in pkg.pools.GROUPS.items()}


def _blocks(pkg, n: int = 6) -> dict[str, int]:
    return {name: n for name in pkg.pools.GROUPS}


def test_contract_carries_the_new_shapes(alt):
    c = alt.contract
    assert (c.RANKS, c.EP, c.MAX_EXTENT, c.SLOTS_PER_RANK) == (4, 4, 4096, 2)
    assert c.decode_layout(1).kernel == "decode_b8s2"
    assert sorted(alt.kernels.KERNELS) == ["decode_b4s3", "decode_b4s4", "decode_b8s1",
                                            "decode_b8s1_mtp", "decode_b8s2", "prefill_main",
                                            "prefill_mtp"]
    assert sorted(alt.kernels.DECODE_BY_K) == sorted(alt.kernels.DECODE_KEEPING_SLOTS_BY_K)
    keeping = alt.kernels.DECODE_KEEPING_SLOTS_BY_K[0]
    assert (keeping.kind, keeping.k, keeping.seq, keeping.rows) == ("decode_mtp", 0, 1, 8)
    assert keeping.class_name == "DecodeB8S1Mtp"
    assert c.REQUEST_SLOTS_PER_RANK == 8 * 2  # batch x micro_batches
    assert c.CONTEXT_BUCKETS == (2048, 4096)
    assert (c.context_bucket(1), c.context_bucket(2049), c.context_bucket(4096)) == \
        (2048, 4096, 4096)
    with pytest.raises(ValueError, match="exceeds the largest bucket 4096"):
        c.context_bucket(4097)
    assert c.effective_extent(max_num_batched_tokens=1000) == 1000
    assert c.effective_extent() == 4096
    assert c.dispatch_extent(4095) == 4096 and c.dispatch_extent(1) == 128
    with pytest.raises(ValueError, match="no decode layout for K=4"):
        c.decode_layout(4)


def test_pools_allocate_stacked_tensors_with_a_scratch_page(alt):
    pools = allocate_pools(alt, _blocks(alt, 6))
    assert pools.ori.shape == (4, 5, 7, 128, 128)          # 6 pages + the scratch page
    assert pools.cmp_c4.shape == (4, 2, 7, 32, 128)
    assert pools.hca_state.shape == (4, 1, 7, 8, 256)
    assert alt.pools.GROUPS["cmp_c4"].table_width == 4096 // 4 // 32
    groups = alt.pools.GROUPS
    assert sum(groups[g].block_bytes * n for g, n in _blocks(alt, 6).items()) == sum(
        t[0, :, :-1].numel() * t.element_size() for t in vars(pools).values())
    mtp = allocate_mtp_state(alt)
    assert mtp.slots.shape == (4, 17, 4) and mtp.hidden.shape == (4, 17, 4, 256)
    assert [f.name for f in alt.pools.MtpField] == ["TAIL_TOKEN", "TAIL_POS", "COMMITTED",
                                                    "GENERATION"]


def test_prefill_main_marshals_a_dynamic_extent(alt):
    pools, weights = allocate_pools(alt, _blocks(alt)), Weights(alt.architecture.FINGERPRINT)
    wrapper = Launcher(alt.kernels.PREFILL_MAIN, backend="dryrun")
    tokens = np.arange(4 * 2 * 384).reshape(4, 2, 384)
    args = wrapper.marshal(token_ids=tokens, start_pos=np.zeros((4, 2), np.int32),
                           chunk_lens=np.full((4, 2), 300, np.int32), pools=pools,
                           weights=weights, extent=384, **_tables(alt, 4, 2))
    assert args._fields[:-2] == tuple(a.name for a in alt.kernels.PREFILL_MAIN.args)
    assert args.token_ids.shape == (4, 2, 384)
    assert torch.equal(args.token_ids, torch.from_numpy(tokens))
    assert args.extent == 384
    assert args.pool_ori is pools.ori
    out = wrapper.launch(token_ids=tokens, start_pos=np.zeros((4, 2), np.int32),
                         chunk_lens=np.full((4, 2), 300, np.int32), pools=pools,
                         weights=weights, extent=384, **_tables(alt, 4, 2))
    assert out.logits.shape == (4, 2, 4096) and out.mtp_hidden.shape == (4, 2, 128, 4, 256)


def test_staging_buffers_are_allocated_once_and_reused(alt):
    wrapper = Launcher(alt.kernels.DECODE_BY_K[1], backend="dryrun")
    kwargs = _decode_kwargs(alt)
    first = wrapper.marshal(**kwargs)
    second = wrapper.marshal(**kwargs)
    assert all(a is b for a, b in zip(first, second) if isinstance(a, torch.Tensor))
    out = wrapper.launch(**kwargs)
    assert out.logits.shape == (4, 8, 2, 4096) and out.draft_ids.shape == (4, 8, 1)
    assert out.logits.data_ptr() == wrapper.launch(**kwargs).logits.data_ptr()


def _decode_kwargs(alt, **override) -> dict:
    words = (alt.architecture.CONFIG["vocab_size"] + 31) // 32
    kwargs = dict(slot_ids=np.zeros((4, 8), np.int32), slot_gens=np.ones((4, 8), np.int64),
                  draft_mask=np.full((4, 8, words), -1, np.int32),
                  pools=allocate_pools(alt, _blocks(alt)), mtp=allocate_mtp_state(alt),
                  weights=Weights(alt.architecture.FINGERPRINT), context=100,
                  **_tables(alt, 4, 8))
    kwargs.update(override)
    return kwargs


def test_marshal_rejects_metadata_of_the_old_shapes(alt):
    wrapper = Launcher(alt.kernels.DECODE_BY_K[1], backend="dryrun")
    with pytest.raises(ABIError, match=r"slot_ids: shape \(8, 4\), expected \(4, 8\)"):
        wrapper.marshal(**_decode_kwargs(alt, slot_ids=np.zeros((8, 4), np.int32)))


def test_marshal_rejects_pools_of_the_wrong_rank_count(alt):
    wrapper = Launcher(alt.kernels.DECODE_BY_K[1], backend="dryrun")
    pools = allocate_pools(alt, _blocks(alt))
    short = type(pools)(**{**vars(pools), "ori": pools.ori[:3]})
    with pytest.raises(ABIError, match=r"pool_ori: shape \(3, 5, 7, 128, 128\), expected "
                                       r"\(4, 5, \*, 128, 128\)"):
        wrapper.marshal(**_decode_kwargs(alt, pools=short))


def test_marshal_rejects_weights_of_another_architecture(alt):
    wrapper = Launcher(alt.kernels.DECODE_BY_K[1], backend="dryrun")
    with pytest.raises(ABIError, match="does not match spec alt-shapes"):
        wrapper.marshal(**_decode_kwargs(alt, weights=Weights("0" * 16)))
