"""`v4serve spec new` on a DeepSeek V4.1 checkpoint: either config spelling gives the
spec of specs/v41-tiny.yaml; a V4 base lends its serving choices and cache formats."""
from __future__ import annotations

import argparse
import json

import pytest
import yaml

from codegen.pipeline import load_spec
from codegen.spec_new import released_weights, run_new, spec_from_config, token_ids
from tests.conftest import REPO, SPECS

V41 = REPO / "tests" / "fixtures" / "v41-tiny"


def _spec_new(config, base, out) -> int:
    return run_new(argparse.Namespace(from_config=config, base=base, output=out))


def test_both_spellings_give_the_v41_tiny_spec(tmp_path, capsys):
    """The release's config.json and inference/config.json (bos/eos from the tokenizer,
    the weights from the folder above) on the v41-tiny base: one spec, the checked-in one."""
    ours = load_spec(SPECS / "v41-tiny.yaml")
    for config in (V41 / "config.json", V41 / "inference" / "config.json"):
        out = tmp_path / f"{config.parent.name}.yaml"
        assert _spec_new(config, SPECS / "v41-tiny.yaml", out) == 0, capsys.readouterr().err
        assert load_spec(out) == ours, config


def test_v4_base_lends_its_serving_choices_and_its_served_formats(tmp_path, capsys):
    """V4-Flash stores its cache packed, so the V4.1 groups take V4.1's served formats;
    its 8 expert-parallel ranks do not divide the tiny's 4 DSpark experts: said, located."""
    out = tmp_path / "flash-base.yaml"
    assert _spec_new(V41 / "config.json", SPECS / "deepseek-v4-flash.yaml", out) == 1
    assert "topology.ep: 8 does not divide dspark_n_routed_experts 4" in capsys.readouterr().err
    groups = yaml.safe_load(out.read_text())["pools"]["groups"]
    assert {name: (g["format"], g["dtype"], g["rows_per_page"]) for name, g in groups.items()} == {
        "ori": ("fp8_32", "bfloat16", 128), "cmp_c1": ("fp4_16", "bfloat16", 128),
        "cmp_c2": ("fp4_16", "bfloat16", 64), "idx_c1": ("fp4_32", "bfloat16", 128),
        "idx_c2": ("fp4_32", "bfloat16", 64), "state_c2": ("compute", "float32", 2)}


def test_tokens_and_weights_of_the_fixture():
    assert token_ids(V41 / "inference") == {"bos_token_id": 0, "eos_token_id": 1}
    assert released_weights(V41, v41=True) == {"dense": "unquantized",
                                               "experts": "unquantized", "engram": "fp8"}


def test_a_v41_config_missing_a_key_names_it():
    config = json.loads((V41 / "config.json").read_text())
    del config["text_config"]["candidate_block_size"]
    with pytest.raises(ValueError, match="^config.json lacks candidate_block_size$"):
        spec_from_config(config, load_spec(SPECS / "v41-tiny.yaml"))
    inference = json.loads((V41 / "inference" / "config.json").read_text())
    del inference["window_size"]
    with pytest.raises(ValueError, match="^inference config lacks window_size$"):
        spec_from_config(inference, load_spec(SPECS / "v41-tiny.yaml"))


def test_a_v4_config_needs_a_v4_base():
    config = json.loads((REPO / "tests" / "fixtures" / "v4-tiny" / "config.json").read_text())
    with pytest.raises(ValueError, match="config.json is DeepSeek V4's and the base spec is "
                                         "not"):
        spec_from_config(config, load_spec(SPECS / "v41-tiny.yaml"))
