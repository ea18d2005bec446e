"""Weights held as released: a checkpoint with FP8 projections and FP4 routed experts
(the reference fixture, quantized by bench/quantize.py) stays quantized on the device,
about its size on disk, and gives exactly what the same checkpoint dequantized at load
gives, on the torch backend and through the compiled graphs.

The tolerance: none on the torch and eager compiled paths (a kernel dequantizes by the
loader's arithmetic, then runs the same matmul on the same values); 1e-5 where inductor
compiles a graph (it may fuse and reorder float32 sums, as it does unquantized)."""
from __future__ import annotations

import json
import struct

import pytest
import torch

from bench.quantize import fp4, fp8, quantize_checkpoint
from runtime.backends.compiled import forward
from runtime.backends.compiled.graphs import Graphs
from runtime.backends.compiled.model import CompiledModel
from runtime.core.sampling_params import SamplingParams
from runtime.model import quant
from runtime.weights.loader import bytes_per_rank, load_params, resident_bytes
from tests.model.support import FIXTURE, REF, Driver
from tests.runtime.engine_support import make_engine, random_prompt

PROMPTS = [random_prompt(300, 1), random_prompt(40, 2), random_prompt(129, 3)]
SAMPLING = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The release's layout, its unquantized tensors in the spec's compute dtype (as
    V4's bf16 tensors are under a bf16 spec): what is on disk is what is held."""
    return quantize_checkpoint(FIXTURE, tmp_path_factory.mktemp("fp8-fp4"), torch.float32)


@pytest.fixture(scope="module")
def released(checkpoint):
    return load_params(checkpoint, REF, weight_format="as_released")


@pytest.fixture(scope="module")
def dequantized(checkpoint):
    return load_params(checkpoint, REF, weight_format="float32")


def _payload_bytes(path) -> int:
    """The tensor bytes of a safetensors file (its size less the JSON header)."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
        json.loads(f.read(header))
    return path.stat().st_size - 8 - header


def test_resident_weights_are_within_10_percent_of_the_bytes_on_disk(checkpoint, released,
                                                                      dequantized):
    disk = _payload_bytes(checkpoint / "model.safetensors")
    held = resident_bytes(released)            # this process holds every rank's experts
    assert abs(held - disk) <= 0.10 * disk, (held, disk)
    assert resident_bytes(dequantized) > 2 * disk           # float32 at load: ~4x FP8
    layer = released.layer(1)
    assert layer["attn.wq_b.weight"].dtype == quant.FP8
    assert layer["attn.wq_b.scale"].dtype == torch.uint8      # e8m0 exponents
    experts = released.experts[1]
    assert experts.quantized and experts.w13.dtype == quant.FP4
    assert experts.w13.shape[-1] * 2 == dequantized.experts[1].w13.shape[-1]
    assert released["embed.weight"].dtype == torch.float32    # gathered whole: dequantized


def test_every_position_equals_the_dequantized_checkpoint(released, dequantized):
    prompt = PROMPTS[0]
    for chunk in (300, 128, 37):
        got, _ = Driver(released).prefill(prompt, chunk)
        want, _ = Driver(dequantized).prefill(prompt, chunk)
        assert torch.equal(got, want), chunk


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "compiled"])
def test_greedy_tokens_and_logprobs_equal_the_dequantized_checkpoint(released, dequantized,
                                                                     backend):
    runs = []
    for params in (released, dequantized):
        engine = make_engine(params, backend=backend, enforce_eager=True)
        runs.append(engine.generate(PROMPTS, SAMPLING))
    for got, want in zip(*runs):
        assert got.output_ids == want.output_ids
        assert [t.logprob for t in got.logprobs] == [t.logprob for t in want.logprobs]


@pytest.mark.slow
def test_a_compiled_graph_dequantizes_inside_it(released, dequantized):
    """The CSA block (fused FP8 projections whose parts are not 128-row aligned, FP4
    experts) through inductor on the quantized weights gives the eager block on the
    dequantized ones."""
    from tests.model.test_compiled import CASES, _call, _pools

    outs = []
    for params, mode in ((dequantized, "eager"), (released, "compile")):
        model = CompiledModel(params, dict(REF.pools.GROUPS), Graphs(mode))
        layer = next(lay for lay in model.main_layers if lay.kind == "csa")
        driver = Driver(params)
        call = _call(driver, CASES[-1]["prompt_ids"][:REF.contract.TILE], 0)
        with torch.inference_mode():
            outs.append(model.block(layer, model.embed(call.ids), call, _pools(driver),
                                    REF.contract.CONTEXT_BUCKETS[0]))
    assert any(quant.is_quantized(t) for t in layer.weights.values())
    assert len(layer.experts) == 4                    # packed stacks and their scales
    assert torch.allclose(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_fused_fp8_parts_keep_their_scales_row_by_row(released, dequantized):
    """Stacking FP8 matrices for one matmul keeps every part's values, aligned or not."""
    forward.layers(released, dict(REF.pools.GROUPS))
    forward.layers(dequantized, dict(REF.pools.GROUPS))
    for layer in range(released.args.n_layers):
        prefix = released.args.prefix(layer)
        got = quant.weight(released.dense, prefix + "fused.x", torch.float32)
        assert torch.equal(got, dequantized.dense[prefix + "fused.x"]), layer


def test_fp8_and_fp4_round_trip_what_they_can_represent():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 96), generator=gen)
    exact = quant.e2m1_values(codes) * 2.0 ** torch.randint(-3, 4, (64, 3), generator=gen) \
        .repeat_interleave(32, 1)
    packed, scale = fp4(exact)
    assert torch.equal(quant.dequantize(packed.view(torch.uint8), scale.view(torch.uint8),
                                        torch.float32), exact)
    weight = torch.randint(-8, 9, (200, 300), generator=gen).float() / 4
    data, scale = fp8(weight)
    assert torch.equal(quant.dequantize(data, scale.view(torch.uint8), torch.float32), weight)
    rows = quant.row_scales(scale.view(torch.uint8), 200)
    assert torch.equal(quant.dequantize(data, rows, torch.float32), weight)


def test_e2m1_codes_are_the_eight_magnitudes_and_their_negatives():
    values = quant.e2m1_values(torch.arange(16)).tolist()
    assert values[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert values[8:] == [-v for v in values[:8]]


@pytest.mark.slow
def test_rank_processes_hold_their_own_packed_experts_and_give_the_same_tokens(checkpoint,
                                                                              released):
    """--distributed-executor-backend mp: each rank reads its own FP4 experts (the
    all-to-all MoE dequantizes them there) and the outputs are the single process's."""
    from runtime.core.config import EngineConfig
    from runtime.engine.engine import Engine

    outputs, info = {}, None
    for executor in ("uni", "mp"):
        engine = Engine.build(EngineConfig(
            spec="reference", model=checkpoint, backend="compiled", enforce_eager=True,
            distributed_executor_backend=executor, worker_threads=1))
        try:
            outputs[executor] = [o.output_ids for o in engine.generate(PROMPTS, SAMPLING)]
            info = engine.summary()
        finally:
            engine.close()
    assert outputs["mp"] == outputs["uni"]
    own = load_params(checkpoint, REF, held=range(3, 4))
    assert all(e.quantized and e.count == REF.contract.EXPERTS_PER_RANK
               for e in own.experts.values())
    assert {r["param_bytes"] for r in info["processes"]} == {bytes_per_rank(own)}
