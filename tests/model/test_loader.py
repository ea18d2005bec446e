"""The checkpoint loader: FP8/FP4 dequantization, expert placement, every error path."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.model.quant import dequantize, e2m1_values
from runtime.weights.loader import CheckpointError, load_params
from tests.model.support import FIXTURE, REF


@pytest.fixture
def tensors():
    return load_file(str(FIXTURE / "model.safetensors"))


def _write(tmp_path, tensors, config=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    if config is None:
        shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    else:
        (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _fp8(weight: torch.Tensor, block_scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize weight [out, in] with the given power-of-two scales per 128x128 block."""
    full = block_scales.repeat_interleave(128, 0)[: weight.shape[0]]
    full = full.repeat_interleave(128, 1)[:, : weight.shape[1]]
    return (weight / full).to(torch.float8_e4m3fn), block_scales.to(torch.float8_e8m0fnu)


def _fp4(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack e2m1 codes [out, in] two per byte (low nibble first); scales [out, in/32]."""
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, scales.to(torch.float8_e8m0fnu)


def test_fp8_dequantizes_with_128x128_block_scales():
    weight = torch.tensor([[1.5, -2.0], [0.25, 3.0]]).repeat(100, 100)   # [200, 200]
    scales = torch.tensor([[0.5, 4.0], [2.0, 0.125]])
    q, s = _fp8(weight, scales)
    assert torch.equal(dequantize(q, s.float(), torch.float32), weight)
    assert dequantize(q, s.float(), torch.float32)[0, 0] == 1.5 and q.float()[0, 0] == 3.0


def test_fp4_dequantizes_low_nibble_first_with_a_scale_per_32_inputs():
    codes = torch.arange(64).remainder(16).view(1, 64)
    scales = torch.tensor([[2.0, 0.5]])
    packed, s = _fp4(codes, scales)
    assert packed.shape == (1, 32) and int(packed.view(torch.uint8)[0, 0]) == 0x10
    got = dequantize(packed.view(torch.uint8), s.float(), torch.float32)
    want = e2m1_values(codes[0])
    want = want * torch.tensor([2.0] * 32 + [0.5] * 32)
    assert torch.equal(got[0], want)


def test_quantized_checkpoint_loads_to_the_dequantized_values(tmp_path, tensors):
    name = "layers.1.attn.wq_b.weight"             # [512, 64]: 4x1 blocks of 128x128
    exact = torch.randint(-4, 5, tensors[name].shape).float() / 2
    tensors[name], tensors["layers.1.attn.wq_b.scale"] = _fp8(
        exact, torch.tensor([[1.0], [2.0], [0.5], [4.0]]))
    expert = "layers.2.ffn.experts.5.w1.weight"     # [64, 128]: FP4, 4 scales a row
    codes = torch.randint(0, 16, (64, 128))
    tensors[expert], tensors["layers.2.ffn.experts.5.w1.scale"] = _fp4(
        codes, torch.full((64, 4), 0.5))
    params = load_params(_write(tmp_path, tensors), REF, weight_format="float32")
    assert torch.equal(params[name], exact)
    values = e2m1_values(codes) * 0.5
    per_rank = params.experts_per_rank
    assert torch.equal(params.rank_experts(2, 5 // per_rank).w1[5 % per_rank], values)
    assert torch.equal(params.experts[2].w1[5], values)
    held = load_params(tmp_path, REF, weight_format="as_released")
    assert held[name].dtype == torch.float8_e4m3fn            # kept as released ...
    scale = held["layers.1.attn.wq_b.scale"]
    assert torch.equal(dequantize(held[name], scale, torch.float32), exact)
    assert not held.experts[2].quantized        # ... but one FP4 expert among float ones
    assert torch.equal(held.experts[2].w1[5], values)


def test_each_rank_holds_its_own_experts(tensors):
    params = load_params(FIXTURE, REF)
    per_rank = REF.contract.EXPERTS_PER_RANK
    assert not any(".experts." in name for name in params.dense)
    for layer, stack in params.experts.items():
        assert stack.count == REF.contract.EP * per_rank
        for rank in range(REF.contract.EP):
            shard = params.rank_experts(layer, rank)
            assert shard.count == per_rank and shard.first == rank * per_rank
            for local in range(per_rank):
                e = rank * per_rank + local
                prefix = params.args.prefix(layer)
                assert torch.equal(shard.w2[local],
                                   tensors[f"{prefix}ffn.experts.{e}.w2.weight"].float())


def test_missing_tensor_is_named(tmp_path, tensors):
    del tensors["layers.2.attn.compressor.ape"]
    with pytest.raises(CheckpointError, match="missing tensor layers.2.attn.compressor.ape"):
        load_params(_write(tmp_path, tensors), REF)


def test_extra_tensor_is_named(tmp_path, tensors):
    tensors["layers.0.attn.compressor.ape"] = torch.zeros(4, 256)
    with pytest.raises(CheckpointError, match="unexpected tensor layers.0.attn.compressor.ape"):
        load_params(_write(tmp_path, tensors), REF)


def test_misshaped_tensor_is_named(tmp_path, tensors):
    tensors["mtp.0.e_proj.weight"] = torch.zeros(128, 64, dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"tensor mtp.0.e_proj.weight has shape "
                                              r"\(128, 64\), expected \(128, 128\)"):
        load_params(_write(tmp_path, tensors), REF)


def test_config_that_disagrees_with_the_spec_names_the_key(tmp_path, tensors):
    config = json.loads((FIXTURE / "config.json").read_text())
    config["index_topk"] = 32
    with pytest.raises(CheckpointError, match="index_topk is 32 but specs/reference.yaml says 16"):
        load_params(_write(tmp_path, tensors, config), REF)
    del config["index_topk"]
    with pytest.raises(CheckpointError, match="lacks 'index_topk'"):
        load_params(_write(tmp_path, tensors, config), REF)


def test_directory_without_safetensors(tmp_path):
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no \\*.safetensors files"):
        load_params(tmp_path, REF)


@pytest.mark.parametrize("damage, message", [
    ("scale on a float weight", "layers.0.attn.wq_a.weight has a scale but is stored as "),
    ("orphan scale", "unexpected tensor layers.0.attn.wq_z.scale"),
    ("fp4 scale shape", r"scale layers.2.ffn.experts.5.w1.scale has shape \(64, 1\), "
                        r"expected \(64, 4\)"),
    ("e5m2 weight", "layers.1.attn.wq_b.weight has a scale but is stored as F8_E5M2"),
    ("float8 without scale", "layers.1.attn.wq_b.weight is float8 without a scale"),
    ("scaled vector", "layers.0.attn_norm.weight has a scale, but only matrices"),
])
def test_a_scale_that_does_not_fit_its_weight_is_named(tmp_path, tensors, damage, message):
    if damage == "scale on a float weight":
        tensors["layers.0.attn.wq_a.scale"] = torch.ones(1, 1)
    elif damage == "orphan scale":
        tensors["layers.0.attn.wq_z.scale"] = torch.ones(1, 1)
    elif damage == "fp4 scale shape":
        name = "layers.2.ffn.experts.5.w1"
        tensors[f"{name}.weight"], _ = _fp4(torch.randint(0, 16, (64, 128)),
                                            torch.ones(64, 4))
        tensors[f"{name}.scale"] = torch.ones(64, 1).to(torch.float8_e8m0fnu)
    elif damage == "e5m2 weight":
        name = "layers.1.attn.wq_b"
        tensors[f"{name}.weight"] = tensors[f"{name}.weight"].to(torch.float8_e5m2)
        tensors[f"{name}.scale"] = torch.ones(4, 1).to(torch.float8_e8m0fnu)
    elif damage == "float8 without scale":
        name = "layers.1.attn.wq_b.weight"
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    else:
        tensors["layers.0.attn_norm.scale"] = torch.ones(1)
    with pytest.raises(CheckpointError, match=message):
        load_params(_write(tmp_path, tensors), REF)


def test_float_and_e8m0_scales_mix_in_one_stacked_matmul(tmp_path, tensors):
    """One projection of `fused.x` with a float32 scale, the others e8m0: the stack
    keeps every part's values."""
    from bench.quantize import quantize
    from runtime.backends.compiled import forward
    from runtime.model import quant

    quantized = {}
    for name, tensor in tensors.items():
        quantized.update(quantize(name, tensor, torch.float32))
    scale = "layers.0.attn.wq_a.scale"
    quantized[scale] = quantized[scale].float() * 1.0         # float32 powers of two
    path = _write(tmp_path, quantized)
    held, plain = (load_params(path, REF, weight_format=f) for f in ("as_released", "float32"))
    assert held[scale].dtype == torch.float32 and held["layers.0.attn.wkv.scale"].dtype \
        == torch.uint8
    forward.layers(held, dict(REF.pools.GROUPS))
    forward.layers(plain, dict(REF.pools.GROUPS))
    assert torch.equal(quant.weight(held.dense, "layers.0.fused.x", torch.float32),
                       plain["layers.0.fused.x"])
