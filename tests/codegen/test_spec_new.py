"""`v4serve spec new`: a checkpoint without a spec becomes servable by a YAML file."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from codegen.abi import kernel_plans
from codegen.pipeline import generate, load_spec, plan_spec
from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_pools
from tests.conftest import REPO, import_fresh

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "v4-tiny"


def _spec_new(config, base, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", "spec", "new", "--from-config",
                           str(config), "--base", str(base), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True)


def test_reference_config_on_the_tiny_base_reproduces_the_reference_spec(tmp_path):
    out = tmp_path / "specs" / "ref.yaml"
    result = _spec_new(FIXTURE / "config.json", REPO / "specs" / "tiny.yaml", out)
    assert result.returncode == 0, result.stderr
    ours, tiny = plan_spec(out, tmp_path), plan_spec(REPO / "specs" / "reference.yaml", REPO)
    assert ours.pools == tiny.pools and ours.fingerprint == tiny.fingerprint
    assert [k.args for k in kernel_plans(ours)] == [k.args for k in kernel_plans(tiny)]


def _other_config() -> dict:
    config = json.loads((FIXTURE / "config.json").read_text())
    config.update(hidden_size=96, head_dim=96, qk_rope_head_dim=32, index_head_dim=48,
                  num_hidden_layers=5, compress_ratios=[128, 4, 0, 128, 4, 0],
                  n_routed_experts=16, num_hash_layers=2, q_lora_rank=48, o_lora_rank=24)
    return config


def test_new_architecture_gets_its_own_pool_widths_and_layers(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_other_config()))
    out = tmp_path / "specs" / "other.yaml"
    assert _spec_new(config, REPO / "specs" / "tiny.yaml", out).returncode == 0
    spec = load_spec(out)
    groups = spec.pools.groups
    assert (groups.ori.row_width, groups.idx.row_width) == (96, 48)
    assert (groups.hca_state.row_width, groups.csa_inner_state.row_width) == (192, 192)
    assert spec.model.compress_ratios == [128, 4, 0, 128, 4, 0]
    assert spec.decode == load_spec(REPO / "specs" / "tiny.yaml").decode


def test_the_new_spec_serves_the_checkpoint_like_transformers(tmp_path):
    """A non-degenerate init (random sinks, biases, hc bases, router bias), every
    position, whole and chunked at 128: the new spec's forward is transformers'."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    from contract.checkpoint_layout import expected_shapes
    from contract.model_args import ModelArgs
    from runtime.weights.loader import load_params
    from tests.model.support import Driver, export_official, randomize

    config = _other_config()
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**copy.deepcopy(config))).float().eval()
    randomize(model, config, seed=3)
    gen = torch.Generator().manual_seed(4)
    mtp = {n: torch.randn(s, generator=gen) * 0.05 for n, s in
           expected_shapes(ModelArgs.from_config(config)).items() if n.startswith("mtp.")}
    ckpt = export_official(model.state_dict(), config, tmp_path / "ckpt", mtp)

    spec = tmp_path / "specs" / "other.yaml"
    assert _spec_new(ckpt / "config.json", REPO / "specs" / "tiny.yaml", spec).returncode == 0
    generate([spec], tmp_path / "pkgs", root=tmp_path, every=False)
    pkg = import_fresh(tmp_path / "pkgs", "other")
    params = load_params(ckpt, pkg)

    ids = torch.randint(2, 512, (200,), generator=gen).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits[0]
    for chunk in (8192, 128):
        got, _ = Driver(params, spec=pkg).prefill(ids, chunk)
        assert (got - want).abs().max() <= 1e-4, chunk

    # the generated prefill kernel's last row, as the engine launches it
    c = pkg.contract
    tokens = np.zeros((c.RANKS, c.SLOTS_PER_RANK, 256), np.int64)
    tokens[0, 0, :200] = ids
    lens = np.zeros((c.RANKS, c.SLOTS_PER_RANK), np.int32)
    lens[0, 0] = 200
    tables = {f"block_table_{g}": np.full((c.RANKS, c.SLOTS_PER_RANK, grp.table_width), -1,
                                          np.int32) for g, grp in pkg.pools.GROUPS.items()}
    for g, grp in pkg.pools.GROUPS.items():
        tables[f"block_table_{g}"][0, 0, : min(grp.table_width, 8)] = np.arange(
            min(grp.table_width, 8))
    # eagerly: this spec's six graphs take ~100 s to compile on 2 cores, and compiling
    # is tests/model/test_compiled.py's to check
    out = Launcher(pkg.kernels.PREFILL_MAIN, backend="compiled-eager").launch(
        token_ids=tokens, start_pos=np.zeros_like(lens), chunk_lens=lens, extent=256,
        pools=allocate_pools(pkg, {g: 8 for g in pkg.pools.GROUPS}), weights=params, **tables)
    assert (out.logits[0, 0] - want[-1]).abs().max() <= 1e-4


def test_missing_config_key_and_unfit_base_are_reported(tmp_path):
    config = json.loads((FIXTURE / "config.json").read_text())
    del config["index_topk"]
    (tmp_path / "a.json").write_text(json.dumps(config))
    result = _spec_new(tmp_path / "a.json", REPO / "specs" / "tiny.yaml", tmp_path / "a.yaml")
    assert result.returncode == 1 and "config.json lacks index_topk" in result.stderr

    config = json.loads((FIXTURE / "config.json").read_text())
    config["n_routed_experts"] = 12          # the base's 8 expert-parallel ranks do not divide it
    (tmp_path / "b.json").write_text(json.dumps(config))
    result = _spec_new(tmp_path / "b.json", REPO / "specs" / "tiny.yaml", tmp_path / "b.yaml")
    assert result.returncode == 1
    assert "needs an edit before codegen" in result.stderr
    assert "topology.ep: 8 does not divide n_routed_experts 12" in result.stderr


def test_the_weights_section_says_what_the_checkpoint_stores(tmp_path):
    """FP8 / FP4 from the safetensors headers beside config.json, whatever the base says."""
    from bench.quantize import quantize_checkpoint

    quantized = quantize_checkpoint(FIXTURE, tmp_path / "q")
    for ckpt, base, want in ((quantized, "tiny", ("fp8", "fp4")),
                             (FIXTURE, "deepseek-v4-flash", ("unquantized", "unquantized"))):
        out = tmp_path / "specs" / f"{base}.yaml"
        _spec_new(ckpt / "config.json", REPO / "specs" / f"{base}.yaml", out)
        weights = yaml.safe_load(out.read_text())["weights"]    # written even if it needs edits
        assert (weights["dense"], weights["experts"]) == want, base


def test_a_format_is_declared_only_if_every_weight_of_its_kind_has_it(tmp_path):
    """FP8 on the head alone (dequantized at load anyway) or FP4 experts in one layer
    only (the others load unquantized): the spec plans them unquantized."""
    from safetensors.torch import load_file, save_file

    from bench.quantize import fp4, fp8
    from codegen.spec_new import released_weights

    tensors = load_file(str(FIXTURE / "model.safetensors"))
    tensors["head.weight"], tensors["head.scale"] = fp8(tensors["head.weight"])
    for e in range(4):
        for w in ("w1", "w2", "w3"):
            name = f"layers.0.ffn.experts.{e}.{w}"
            tensors[f"{name}.weight"], tensors[f"{name}.scale"] = fp4(tensors[f"{name}.weight"])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert released_weights(tmp_path) == {"dense": "unquantized", "experts": "unquantized"}
    assert released_weights(tmp_path / "nowhere") is None
