"""Loading a DeepSeek V4.1 checkpoint (tests/fixtures/v41-tiny): the release's names, the
Engram tables as released, the tensors text serving skips, the errors."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.weights.loader import CheckpointError, load_checkpoint
from tests.model.support import FIXTURE_V41, v41_args


@pytest.fixture(scope="module")
def tensors():
    return load_file(str(FIXTURE_V41 / "model.safetensors"))


def _copy(tmp_path, tensors):
    """The fixture's directory with `tensors` as its checkpoint."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE_V41 / name, tmp_path / name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


def _load(directory):
    return load_checkpoint(directory, v41_args(), "test", torch.float32)


def test_engram_tables_stay_as_released_and_the_rest_takes_the_compute_dtype():
    params = _load(FIXTURE_V41)
    assert params["layers.1.engram.embed.weight"].dtype == torch.float8_e4m3fn
    assert params["layers.4.engram.embed.scale"].dtype == torch.float8_e8m0fnu
    assert params["layers.4.engram.embed.weight"].shape == (1786, 32)
    assert params["layers.2.attn.compressor.wgate.weight"].dtype == torch.float32
    assert "layers.6.attn.compressor.wgate.weight" not in params.dense      # ratio 1
    assert params.engram is not None and int(params.engram.token_map.max()) + 1 == 464


def test_each_layer_holds_its_own_routed_experts():
    params = _load(FIXTURE_V41)
    assert params.experts[9].count == 8 and params.experts[10].count == 4    # a DSpark stage
    assert params.rank_experts(10, 0).count == 4


def test_image_tensors_are_skipped_with_one_line(tmp_path, tensors, caplog):
    extra = {"vision.blocks.0.attn.qkv.weight": torch.zeros(4, 4),
             "aligner.proj.weight": torch.zeros(4, 4), "image_newline": torch.zeros(128),
             "layers.3.ffn.gate.bias_vl": torch.zeros(8), "mtp.1.ffn.gate.bias_vl": torch.zeros(4)}
    with caplog.at_level(logging.INFO, logger="runtime.weights.loader"):
        params = _load(_copy(tmp_path, {**tensors, **extra}))
    assert not set(extra) & set(params.dense)
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and "skipped 5 tensors" in lines[0]


def test_a_missing_source_tensor_is_named(tmp_path, tensors):
    damaged = {k: v for k, v in tensors.items() if k != "layers.4.attn.indexer.wk.weight"}
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.4\.attn\.indexer\.wk"):
        _load(_copy(tmp_path, damaged))


def test_a_v4_tensor_in_a_v41_checkpoint_is_named(tmp_path, tensors):
    damaged = {**tensors, "layers.3.attn.compressor.ape": torch.zeros(2, 64)}
    with pytest.raises(CheckpointError, match=r"unexpected tensor layers\.3\.attn\.compressor"):
        _load(_copy(tmp_path, damaged))


def test_a_misshaped_engram_scale_is_named(tmp_path, tensors):
    scale = tensors["layers.1.engram.embed.scale"]
    damaged = {**tensors, "layers.1.engram.embed.scale": scale[:-1]}
    with pytest.raises(CheckpointError, match=r"layers\.1\.engram\.embed\.scale has shape"):
        _load(_copy(tmp_path, damaged))


def test_engram_needs_the_tokenizer(tmp_path, tensors):
    directory = _copy(tmp_path, tensors)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        _load(directory)


def _fp8_32(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] in FP8 e4m3 with a power-of-two (e8m0) scale per 32 x 32 block."""
    out, inp = weight.shape
    blocks = torch.nn.functional.pad(weight.float(), (0, -inp % 32, 0, -out % 32))
    blocks = blocks.view(blocks.shape[0] // 32, 32, blocks.shape[1] // 32, 32)
    amax = blocks.abs().amax((1, 3)).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    full = scale.repeat_interleave(32, 0)[:out].repeat_interleave(32, 1)[:, :inp]
    return (weight.float() / full).to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def test_fp8_projections_in_32x32_blocks_as_released_equal_dequantized(tmp_path, tensors):
    """The release's FP8 projections (scales per 32 x 32) held as released and
    dequantized in the forward give what dequantizing them at load gives."""
    from contract.checkpoint_layout import is_v41_fp8_projection
    from runtime.model.quant import FP8
    from tests.model.support import V41Driver
    quantized = dict(tensors)
    for name, w in tensors.items():
        if is_v41_fp8_projection(name):
            quantized[name], quantized[name.removesuffix(".weight") + ".scale"] = _fp8_32(w)
    directory = _copy(tmp_path, quantized)
    held = load_checkpoint(directory, v41_args(), "test", torch.float32, as_released=True)
    assert held["layers.2.attn.wq_a.weight"].dtype == FP8
    assert held["layers.1.engram.wkv.weight"].dtype == FP8
    assert held["layers.8.attn.indexer.wq_b.weight"].dtype == FP8
    loaded = _load(directory)
    assert loaded["layers.2.attn.wq_a.weight"].dtype == torch.float32
    ids = list(range(2, 90))
    out = [V41Driver(p).feed(ids, 37) for p in (held, loaded)]
    assert torch.equal(out[0], out[1])
    assert not torch.equal(out[1], V41Driver(_load(FIXTURE_V41)).feed(ids, 37))


def test_the_flash_release_loads_as_fake_tensors():
    """specs/deepseek-v41-flash.yaml's release, as a rehearsal loads it (rank 0 of 8):
    the Engram tables FP8 at their full rows, FP8 projections with 32 x 32 block
    scales, bfloat16 where the release keeps it, each layer's share of its experts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import generated
    from runtime.weights.fake_checkpoint import FakeCheckpoint
    from runtime.weights.loader import load_params
    spec = generated.load("deepseek_v41_flash")
    with FakeTensorMode():
        params = load_params(None, spec, checkpoint=FakeCheckpoint(spec), held=range(1))
    table = params["layers.14.engram.embed.weight"]
    assert table.dtype == torch.float8_e4m3fn and table.shape == (384016682, 256)
    assert params["layers.14.engram.embed.scale"].shape == (384016682, 8)
    assert params["layers.2.attn.wq_a.scale"].shape == (1280 // 32, 5120 // 32)
    assert params["layers.2.attn.wo_a.weight"].dtype == torch.bfloat16
    assert params.experts[0].count == 48 and params.experts[40].count == 16
