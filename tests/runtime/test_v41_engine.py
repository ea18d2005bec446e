"""DeepSeek V4.1 through the engine (specs/v41-tiny.yaml on the torch backend, K = 0): the
official code's greedy continuations of tests/fixtures/v41-tiny/golden.json, whole
prompts, chunked at 128, under preemption and on prefix-cache hits, and with the served
cache formats those of golden_kvquant.json; and what a V4.1 spec refuses (drafts, the
compiled backend)."""
from __future__ import annotations

import argparse

import pytest
import torch

from codegen.pipeline import generate
from codegen.spec_new import run_new
from runtime.core.config import EngineConfig
from runtime.core.prefix_cache import Layout
from runtime.core.sampling_params import SamplingParams
from runtime.engine.engine import Engine
from runtime.model.paging import PoolView, Segment
from runtime.planning import capacity
from runtime.planning.admission import ConfigError
from runtime.text.tokenizer import Tokenizer
from runtime.weights.loader import load_params
from tests.conftest import SPECS, import_fresh
from tests.model.support import (
    FIXTURE_V41,
    V41,
    V41Driver,
    spec_with_formats,
    v41_golden,
    v41_params,
)
from tests.runtime.engine_support import assert_all_free

CASES = v41_golden()
PROMPTS = [case["prompt_ids"] for case in CASES]
GOLDEN = [case["greedy_ids"] for case in CASES]
GREEDY = SamplingParams(temperature=0.0, max_tokens=len(GOLDEN[0]), ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # tiny tensors


@pytest.fixture(scope="module")
def params():
    return v41_params()


def make_engine(params, spec=V41, **overrides) -> Engine:
    config = EngineConfig(spec=spec.SPEC_NAME, model=FIXTURE_V41, **overrides)
    return Engine(config, spec, params, Tokenizer(FIXTURE_V41))


def _generate(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [list(o.output_ids) for o in engine.generate(prompts, GREEDY)]


def test_the_package_launches_the_prefill_and_k0_decode_on_torch():
    """What codegen gives a V4.1 spec: the main prefill and the K=0 decode, each with
    the Engram history of its rows; torch, whatever the spec asks."""
    kernels = V41.kernels
    assert sorted(kernels.KERNELS) == ["decode_b8s1", "prefill_main"]
    assert list(kernels.DECODE_BY_K) == [0]
    assert kernels.PREFILL_MAIN.arg("engram_prior").shape == ("ranks", 4, 3)
    assert kernels.DECODE_B8S1.arg("engram_prior").shape == ("ranks", 8, 3)
    assert "mtp_hidden" not in [a.name for a in kernels.PREFILL_MAIN.args]
    assert (V41.contract.BACKEND, V41.contract.DEFAULT_NUM_SPECULATIVE_TOKENS) == ("torch", 0)


def test_whole_prompts_give_the_official_greedy_tokens(params):
    """The five prompts (2 to 300 tokens) at once, each prefilled in one chunk."""
    engine = make_engine(params, enable_prefix_caching=False)    # no split at a save
    assert _generate(engine, PROMPTS) == GOLDEN
    assert engine.dispatches["prefill_main"] == 1
    assert_all_free(engine)


def test_prompts_chunked_at_128_give_the_official_greedy_tokens(params):
    """--max-num-batched-tokens 128: the 150- and 300-token prompts span chunks, so the
    Engram history, ratio-2 groups and candidate blocks cross launches."""
    engine = make_engine(params, max_num_batched_tokens=128)
    assert _generate(engine, PROMPTS) == GOLDEN
    assert engine.dispatches["prefill_main"] >= 3          # 300 tokens: 3 chunks
    assert_all_free(engine)


@pytest.mark.slow          # 20 requests under pressure: ~6 s
def test_preemption_keeps_every_continuation(params):
    """Four copies of every prompt on pools of 4 blocks a group per rank: decoding past
    a 128-token boundary needs blocks that only preemption frees; the preempted come
    back (recomputing, or hitting the boundaries they saved) with the same tokens."""
    layout = Layout.of(V41.pools.GROUPS, V41.architecture.CONFIG, V41.contract.BLOCK_SIZE, 0)
    tight = capacity.bytes_for(V41.pools.GROUPS, 16, 4 * 128, layout.copies)
    engine = make_engine(params, kv_cache_memory=tight, max_model_len=512)
    assert _generate(engine, PROMPTS * 4) == GOLDEN * 4
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine)


@pytest.mark.slow          # 20 requests under pressure: ~6 s
def test_preemption_without_the_prefix_cache_recomputes_the_same_tokens(params):
    layout_free = capacity.bytes_for(V41.pools.GROUPS, 16, 4 * 128)
    engine = make_engine(params, kv_cache_memory=layout_free, max_model_len=512,
                         enable_prefix_caching=False)
    assert _generate(engine, PROMPTS * 4) == GOLDEN * 4
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine)


def test_a_repeated_prompt_hits_the_prefix_cache_and_gives_the_same_tokens(params):
    """The 300-token prompt again: its first two blocks (256 tokens) come from the cache,
    the rest is prefilled after them with the Engram history read off the request."""
    engine = make_engine(params)
    first = engine.generate([PROMPTS[-1]], GREEDY)[0]
    again = engine.generate([PROMPTS[-1]], GREEDY)[0]
    assert list(first.output_ids) == list(again.output_ids) == GOLDEN[-1]
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 256)


def test_drafts_are_refused_with_the_reason(params):
    with pytest.raises(ConfigError, match="--num-speculative-tokens 1: spec specs/v41-tiny.yaml "
                                          "is DeepSeek V4.1, whose DSpark drafts are not "
                                          "launched yet"):
        make_engine(params, num_speculative_tokens=1)


def test_the_compiled_backend_is_refused_with_the_reason(params):
    with pytest.raises(ConfigError, match="backend 'compiled': spec specs/v41-tiny.yaml is "
                                          "DeepSeek V4.1, whose kernels run on the torch "
                                          "backend only"):
        make_engine(params, backend="compiled")


def test_spec_new_then_codegen_then_generate_serves_the_checkpoint(tmp_path):
    """The acceptance's path for a checkpoint: `v4serve spec new` from its config.json
    (on the v41-tiny base), codegen of that spec, then its package serving the prompts
    chunked at 128: the official greedy tokens."""
    spec = tmp_path / "specs" / "new-v41.yaml"
    spec.parent.mkdir()
    assert run_new(argparse.Namespace(from_config=FIXTURE_V41 / "config.json",
                                      base=SPECS / "v41-tiny.yaml", output=spec)) == 0
    generate([spec], tmp_path / "pkgs", root=tmp_path, every=False)
    package = import_fresh(tmp_path / "pkgs", "new_v41")
    engine = make_engine(load_params(FIXTURE_V41, package), spec=package,
                         max_num_batched_tokens=128)
    assert _generate(engine, PROMPTS) == GOLDEN


# V4.1's served entry formats (runtime/model/v41_formats.py), as deepseek-v41-flash stores them
SERVED = {"ori": "fp8_32", "cmp_c1": "fp4_16", "cmp_c2": "fp4_16", "idx_c1": "fp4_32",
          "idx_c2": "fp4_32"}


@pytest.mark.slow              # a spec generated and its checkpoint loaded again: ~4 s each
@pytest.mark.parametrize("batched", [None, 128], ids=["whole", "chunked128"])
def test_served_cache_formats_give_the_quantized_official_tokens(tmp_path, batched):
    """v41-tiny storing its window fp8_32, compressed KV fp4_16 and index keys fp4_32:
    the official code's greedy tokens with its quantization on (golden_kvquant.json,
    which differ from golden.json's in every case)."""
    package = spec_with_formats("v41-tiny", SERVED, tmp_path)
    engine = make_engine(load_params(FIXTURE_V41, package), spec=package,
                         max_num_batched_tokens=batched)
    quantized = v41_golden("golden_kvquant.json")
    assert [c["prompt_ids"] for c in quantized] == PROMPTS
    assert _generate(engine, PROMPTS) == [c["greedy_ids"] for c in quantized]


def _ring(view: PoolView, rank: int, layer: int, positions: range) -> torch.Tensor:
    return view.read("ori", Segment(rank, 0, 0, 0, 0), layer, torch.tensor(positions))


def test_the_dspark_rings_follow_the_model(params):
    """The launches keep each DSpark stage's window ring (its main_kv rows, "ori") as the
    reference driver does, so a drafter finds it whole: the 150-token prompt chunked at
    128, then two decode steps; every stage's last 128 rows match."""
    prompt = PROMPTS[3]
    engine = make_engine(params, max_num_batched_tokens=128, enable_prefix_caching=False)
    request = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                        ignore_eos=True))
    while request.num_computed < len(prompt) + 2:
        engine.step()
    tables = torch.full((V41.contract.RANKS, 1, V41.pools.GROUPS["ori"].table_width), -1,
                        dtype=torch.int32)
    tables[request.rank, 0, : len(request.blocks["ori"])] = torch.tensor(request.blocks["ori"])
    pools = engine.executor.pools
    served = PoolView({"ori": pools.ori}, {"ori": tables}, V41.pools.GROUPS)
    driver = V41Driver(params)
    driver.feed(request.tokens(0, request.num_computed), 128)
    end = request.num_computed
    for stage in range(params.args.n_layers, params.args.n_layers + params.args.n_mtp_layers):
        want = _ring(driver.view(), driver.rank, stage, range(end - 128, end))
        got = _ring(served, request.rank, stage, range(end - 128, end))
        assert want.abs().max() > 0 and torch.allclose(got, want, atol=1e-5), stage


def test_a_rehearsal_refuses_the_package_with_the_reason():
    """`v4serve rehearse` runs the compiled backend's graphs, which V4.1 has none of."""
    from runtime.device.rehearsal import Rehearsal

    with pytest.raises(ValueError, match="spec v41-tiny: its kernels run on the torch backend "
                                         "only, and a rehearsal runs the compiled backend's"):
        Rehearsal(V41)
