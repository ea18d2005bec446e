"""Prefix caching's per-group rules over the pool groups a spec declares: V4's seven
groups keep the window and the overlapped CSA states at a block boundary (as before);
V4.1's groups keep only the window, for its compressors never overlap (state_c2 holds
nothing at a boundary, where every ratio-2 group is closed)."""
from __future__ import annotations

from dataclasses import replace

import pytest

import generated
from contract.model_args import ModelArgs
from runtime.core.prefix_cache import Layout, Unsupported, boundary_span

V4_SPECS = ("tiny", "reference", "deepseek_v4_flash", "deepseek_v4_pro")
V41_SPECS = ("v41_tiny", "deepseek_v41_flash")


def _layout(name: str, k: int = 1) -> Layout:
    spec = generated.load(name)
    return Layout.of(spec.pools.GROUPS, spec.architecture.CONFIG, spec.contract.BLOCK_SIZE, k)


@pytest.mark.parametrize("name", V4_SPECS)
def test_v4_layouts_keep_the_window_and_the_overlapped_csa_states(name):
    layout = _layout(name)
    assert layout.full == ("cmp_c128", "cmp_c4", "idx")
    assert layout.ring == {"ori": (128, 3), "csa_state": (4, 3), "csa_inner_state": (4, 3)}
    assert layout.reach == 8 and layout.lookahead == 1


@pytest.mark.parametrize("name", V41_SPECS)
def test_v41_layouts_keep_the_window_alone(name):
    spec = generated.load(name)
    args = ModelArgs.from_config(spec.architecture.CONFIG)
    groups = spec.pools.GROUPS
    assert boundary_span("ori", groups["ori"], args, 128) == args.window - 1
    assert boundary_span("state_c2", groups["state_c2"], args, 128) == 0
    layout = _layout(name)
    assert layout.full == ("cmp_c1", "cmp_c2", "idx_c1", "idx_c2")
    assert layout.ring == {"ori": (128, 3)}
    assert layout.reach == 128                 # 3 pages of 128 rows minus a 127-row window
    assert layout.copies == {"ori": 128 * 8}


def test_a_ring_group_over_compressors_of_two_ratios_is_refused():
    spec = generated.load("deepseek_v41_flash")
    args = ModelArgs.from_config(spec.architecture.CONFIG)
    mixed = replace(spec.pools.GROUPS["state_c2"], layers=(14, 20))
    with pytest.raises(Unsupported, match="state of compressors of one ratio"):
        boundary_span("state_c2", mixed, args, 128)
