"""The derived plan of the checked-in specs: layer layout, pool formulas and sizes."""
from __future__ import annotations

from collections import Counter

import pytest

from codegen.pipeline import plan_spec
from tests.conftest import REPO


@pytest.fixture(scope="module")
def plans():
    return {name: plan_spec(REPO / "specs" / f"{name}.yaml", REPO)
            for name in ("tiny", "deepseek-v4-flash", "deepseek-v4-pro")}


def _pool(plan, name):
    return next(p for p in plan.pools if p.name == name)


def test_layer_layouts_of_the_released_models(plans):
    assert Counter(plans["deepseek-v4-flash"].layer_kinds) == {
        "sliding": 2, "csa": 21, "hca": 20, "mtp": 1}
    assert Counter(plans["deepseek-v4-pro"].layer_kinds) == {"csa": 30, "hca": 31, "mtp": 1}
    assert plans["tiny"].layer_kinds == ("sliding", "csa", "hca", "csa", "mtp")


def test_pool_layers_follow_the_layer_kinds(plans):
    tiny = plans["tiny"]
    assert _pool(tiny, "ori").layers == (0, 1, 2, 3, 4)
    assert _pool(tiny, "cmp_c128").layers == _pool(tiny, "hca_state").layers == (2,)
    assert _pool(tiny, "cmp_c4").layers == _pool(tiny, "idx").layers == (1, 3)
    assert len(_pool(plans["deepseek-v4-flash"], "ori").layers) == 44


def test_flash_reference_layout(plans):
    flash = plans["deepseek-v4-flash"]
    rows = {p.name: (p.rows_per_page, p.row_width, p.dtype, p.policy) for p in flash.pools}
    assert rows == {
        "ori": (128, 512, "bfloat16", "ring"),
        "cmp_c128": (1, 512, "bfloat16", "full"),
        "cmp_c4": (32, 512, "bfloat16", "full"),
        "idx": (32, 128, "bfloat16", "full"),
        "hca_state": (8, 1024, "float32", "ring"),
        "csa_state": (4, 2048, "float32", "ring"),
        "csa_inner_state": (4, 512, "float32", "ring"),
    }
    formats = {p.name: (p.format, p.entry_bytes) for p in flash.pools}
    assert formats == {"ori": ("fp8_ds", 584), "cmp_c128": ("fp8_ds", 584),
                       "cmp_c4": ("fp8_ds", 584), "idx": ("fp4", 68),
                       "hca_state": ("compute", 4096), "csa_state": ("compute", 8192),
                       "csa_inner_state": ("compute", 2048)}
    ori = _pool(flash, "ori")
    assert ori.ring_pages == 3  # ceil((128 - 1 + 4) / 128) + 1
    # 448 e4m3 values, 64 bfloat16 RoPE values, 7 scales, a byte of padding
    assert ori.page_bytes == 128 * 584 and ori.block_bytes == 44 * ori.page_bytes
    assert _pool(flash, "cmp_c4").table_width == 1048576 // 4 // 32


def test_generated_block_formulas_at_the_boundaries():
    from generated.tiny.pools import GROUPS

    cases = {
        "ori": {1: 1, 128: 1, 129: 2, 256: 2, 257: 3, 100000: 3},
        "cmp_c128": {127: 0, 128: 1, 255: 1, 256: 2},
        "cmp_c4": {3: 0, 4: 1, 128: 1, 131: 1, 132: 2},
        # state rings: the span and the K = 3 rows in flight past the first
        "hca_state": {1: 1, 8: 1, 9: 2, 128: 16, 129: 17, 5000: 17},
        "csa_state": {1: 1, 4: 1, 5: 2, 9: 3, 5000: 3},
    }
    for group, expected in cases.items():
        assert {n: GROUPS[group].blocks_for(n) for n in expected} == expected, group


def test_effective_and_dispatch_extent():
    from generated.tiny import contract

    assert contract.effective_extent() == min(contract.MAX_EXTENT, contract.MAX_MODEL_LEN)
    assert contract.effective_extent(long_prefill_token_threshold=256) == 256
    assert contract.dispatch_extent(8191) == 8192  # one dispatch, not 64
    assert contract.dispatch_extent(129) == 256
    with pytest.raises(ValueError):
        contract.dispatch_extent(contract.MAX_EXTENT + 1)


def test_fingerprint_follows_the_architecture_only(plans, tmp_path, tiny_text):
    from tests.conftest import replace_once

    edited = tmp_path / "tiny.yaml"
    edited.write_text(replace_once(tiny_text, "  max_num_seqs: 64", "  max_num_seqs: 32"))
    assert plan_spec(edited, tmp_path).fingerprint == plans["tiny"].fingerprint
    edited.write_text(replace_once(tiny_text, "  vocab_size: 4096", "  vocab_size: 1024"))
    assert plan_spec(edited, tmp_path).fingerprint != plans["tiny"].fingerprint
