"""The engine with cache entries in V4's served formats (fp8_ds main entries and sliding
window, FP4 indexer keys) keeps every invariance of the engine: greedy output equals the
model run without the scheduler (same formats) whatever the chunking, with MTP, on both
backends, through preemption and through prefix-cache hits. Exactness is between runs of
the same format."""
from __future__ import annotations

import pytest
import torch

from runtime.core.prefix_cache import Layout
from runtime.core.sampling_params import SamplingParams
from runtime.planning import capacity
from tests.model.support import SERVED, reference_params, spec_with_formats
from tests.runtime.engine_support import (
    GREEDY,
    assert_all_free,
    greedy_without_scheduler,
    make_engine,
    random_prompt,
)

pytestmark = pytest.mark.slow

LENGTHS = [127, 257, 600]


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return spec_with_formats("reference", SERVED, tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="module")
def solo(params, served):
    return [greedy_without_scheduler(params, random_prompt(n, n), GREEDY.max_tokens, served)
            for n in LENGTHS]


@pytest.mark.parametrize("backend, extent, k", [
    ("compiled-eager", 8192, 0), ("compiled-eager", 128, 1), ("torch", 256, 1)])
def test_chunking_mtp_and_backend_keep_greedy_output(params, served, solo, backend, extent,
                                                      k):
    engine = make_engine(params, spec=served, backend=backend, num_speculative_tokens=k,
                         long_prefill_token_threshold=extent)
    outputs = engine.generate([random_prompt(n, n) for n in LENGTHS], GREEDY)
    assert [o.output_ids for o in outputs] == solo
    assert_all_free(engine)


def test_a_prefix_cache_hit_gives_what_the_first_run_gave(params, served):
    prompt = random_prompt(600, 7)
    engine = make_engine(params, spec=served, backend="compiled-eager")
    first = engine.generate([prompt], GREEDY)[0].output_ids
    again = engine.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens >= 512 and again.output_ids == first
    pools = engine.executor.pools
    assert pools.cmp_c4.dtype == torch.uint8 and pools.cmp_c4.shape[-1] == 200   # packed
    assert_all_free(engine)


def test_preemption_keeps_every_output(params, served):
    prompts = [random_prompt(120, i) for i in range(64)]
    many = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    calm = make_engine(params, spec=served, num_speculative_tokens=1,
                       backend="compiled-eager").generate(prompts, many)
    copies = Layout.of(served.pools.GROUPS, served.architecture.CONFIG,
                       served.contract.BLOCK_SIZE, 1).copies
    tight = capacity.bytes_for(served.pools.GROUPS, 8, 128 * 8, copies)
    engine = make_engine(params, spec=served, num_speculative_tokens=1, kv_cache_memory=tight,
                         max_model_len=1024, backend="compiled-eager")
    pressed = engine.generate(prompts, many)
    assert engine.scheduler.num_preemptions > 0
    assert [o.output_ids for o in pressed] == [o.output_ids for o in calm]
    assert_all_free(engine)
