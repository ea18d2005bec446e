"""The engine end to end on the tiny spec: chunking, one dispatch per chunk, MTP,
preemption, continuous batching, and that every request gives back what it held."""
from __future__ import annotations

import pytest

from runtime.backends import torch_backend
from runtime.core.prefix_cache import Layout
from runtime.core.sampling_params import SamplingParams
from runtime.planning import capacity
from runtime.planning.admission import ConfigError
from tests.model.support import REF, reference_params
from tests.runtime.engine_support import (
    GREEDY,
    assert_all_free,
    greedy_without_scheduler,
    make_engine,
    random_prompt,
)

pytestmark = pytest.mark.slow

LENGTHS = [127, 128, 129, 255, 256, 257, 600]
# the readable reference, and the compiled backend's graphs run eagerly
BACKENDS = ["torch", "compiled-eager"]


def copies(k: int) -> dict[str, int]:
    """The ring copy pages the prefix cache adds to a budget (runtime/planning/capacity.py)."""
    return Layout.of(REF.pools.GROUPS, REF.architecture.CONFIG, REF.contract.BLOCK_SIZE,
                     k).copies


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture(scope="module")
def solo(params):
    """Greedy tokens of each prompt length, from the model without the scheduler."""
    return {n: greedy_without_scheduler(params, random_prompt(n, n), GREEDY.max_tokens)
            for n in LENGTHS}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("extent", [128, 256, 8192])
def test_chunk_boundaries_do_not_change_greedy_output(params, solo, extent, backend):
    engine = make_engine(params, long_prefill_token_threshold=extent, num_speculative_tokens=0,
                         backend=backend)
    outputs = engine.generate([random_prompt(n, n) for n in LENGTHS], GREEDY)
    assert [o.output_ids for o in outputs] == [solo[n] for n in LENGTHS]
    assert engine.dispatches["prefill_main"] >= max(-(-n // extent) for n in LENGTHS)
    assert_all_free(engine)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_8191_token_prompt_is_one_main_prefill_dispatch(params, backend):
    """Without prefix caching (which splits a prefill where it saves a block boundary)."""
    engine = make_engine(params, num_speculative_tokens=0, backend=backend,
                         enable_prefix_caching=False)
    [output] = engine.generate([random_prompt(8191, 0)], SamplingParams(temperature=0,
                                                                        max_tokens=2))
    assert engine.dispatches["prefill_main"] == 1
    assert len(output.output_ids) == 2


def test_chunk_count_follows_the_lowered_extent(params):
    engine = make_engine(params, long_prefill_token_threshold=256, num_speculative_tokens=0,
                         enable_prefix_caching=False)
    engine.generate([random_prompt(1000, 1)], SamplingParams(temperature=0, max_tokens=1))
    assert engine.dispatches["prefill_main"] == 4   # 256 + 256 + 256 + 232


@pytest.fixture(scope="module")
def plain(params):
    """Greedy outputs of the LENGTHS prompts without MTP."""
    prompts = [random_prompt(n, n) for n in LENGTHS]
    return [o.output_ids for o in make_engine(params, num_speculative_tokens=0)
            .generate(prompts, GREEDY)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_is_lossless_with_the_checkpoint_drafts(params, plain, backend, k):
    """K drafts a step (the MTP layer applied K times); K > 1 in 128-token chunks."""
    prompts = [random_prompt(n, n) for n in LENGTHS]
    engine = make_engine(params, num_speculative_tokens=k, backend=backend,
                         long_prefill_token_threshold=128 if k > 1 else 8192)
    mtp = engine.generate(prompts, GREEDY)
    assert [o.output_ids for o in mtp] == plain
    assert engine.dispatches[f"decode_b4s{k + 1}"] > 0
    assert engine.stats.draft_tokens == k * engine.stats.drafts > 0
    assert_all_free(engine)


@pytest.fixture
def oracle_drafts(monkeypatch):
    """Make each MTP draft the true greedy token, but wrong where its position is 1 mod 4
    (so both acceptance and rejection, at every draft position, run through the real
    kernels). Keyed by position, which the prompts below keep distinct across
    requests."""
    table: dict[int, int] = {}
    real = torch_backend._draft

    def draft(params, kernel, view, rows, tails, tail_pos, hidden, k, masks):
        drafts = real(params, kernel, view, rows, tails, tail_pos, hidden, k, masks)
        for i, pos in enumerate(tail_pos):
            for j in range(k):
                at = pos + 1 + j
                if at in table:
                    right = table[at]
                    drafts[i, j] = right if at % 4 != 1 else (right + 1) % 512
        return drafts

    monkeypatch.setattr(torch_backend, "_draft", draft)
    return table


@pytest.mark.parametrize("k", [1, 3])
def test_accepted_drafts_keep_greedy_output_identical(params, oracle_drafts, k):
    lengths = [126, 127, 200, 300, 400]    # 126/127: drafts cross the 128-row page boundary
    prompts = [random_prompt(n, 1000 + n) for n in lengths]
    params_long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = make_engine(params, num_speculative_tokens=0).generate(prompts, params_long)
    for prompt, out in zip(prompts, plain):
        for i, token in enumerate(out.output_ids):
            oracle_drafts[len(prompt) + i] = token
    engine = make_engine(params, num_speculative_tokens=k)
    mtp = engine.generate(prompts, params_long)
    assert [o.output_ids for o in mtp] == [o.output_ids for o in plain]
    stats = engine.stats
    assert 0.3 < stats.accepted_tokens / stats.draft_tokens < 0.85
    assert all(stats.accepted_per_position)              # every draft position kept some
    steps = engine.dispatches[f"decode_b4s{k + 1}"]
    assert steps < sum(len(o.output_ids) for o in plain) / len(prompts)
    assert_all_free(engine)


# each backend once and each K once (every pairing costs ~35 s of the suite's budget)
@pytest.mark.parametrize("backend, k", [("torch", 0), ("compiled-eager", 1)])
def test_preemption_under_pool_pressure_keeps_every_output(params, k, backend):
    """Prompts of 120 tokens fill a rank's compressed pools at admission; decoding past
    position 131 needs a second CSA block each, which only preemption can free. With
    the prefix cache on (the default): preempted requests save the boundary they passed
    and hit it when they come back."""
    prompts = [random_prompt(120, i) for i in range(64)]
    many = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    calm = make_engine(params, num_speculative_tokens=k).generate(prompts, many)
    running = 8 if k else 16                     # the rank's decode capacity for this K
    tight = capacity.bytes_for(REF.pools.GROUPS, running, 128 * 8, copies(k))
    engine = make_engine(params, num_speculative_tokens=k, kv_cache_memory=tight,
                         max_model_len=1024, backend=backend)
    pressed = engine.generate(prompts, many)
    assert engine.scheduler.num_preemptions > 0
    assert [o.output_ids for o in pressed] == [o.output_ids for o in calm]
    assert_all_free(engine)


@pytest.mark.parametrize("backend", BACKENDS)
def test_64_concurrent_requests_match_their_solo_runs(params, backend):
    prompts = [random_prompt(5 + (i * 97) % 700, 500 + i) for i in range(64)]
    engine = make_engine(params, backend=backend)
    requests = [engine.add_request(p, GREEDY) for p in prompts]
    final = {o.request_id: o for o in engine.step() if o.finished}
    assert {r.rank for r in requests if r.rank is not None} == set(range(8))
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    batched = [final[r.request_id] for r in requests]
    assert len(batched) == 64
    for i in (0, 13, 31, 47, 63):
        solo = make_engine(params).generate([prompts[i]], GREEDY)[0]
        assert batched[i].output_ids == solo.output_ids
    assert engine.dispatches["decode_b4s2"] >= 8   # several micro-batches per step at times
    assert_all_free(engine)


def test_abort_at_any_time_frees_everything(params):
    engine = make_engine(params)
    requests = [engine.add_request(random_prompt(300, i), GREEDY) for i in range(10)]
    engine.abort(requests[0].request_id)          # still waiting
    engine.step()                                  # admitted and prefilled
    engine.abort(requests[1].request_id)          # running
    engine.step()
    engine.abort(requests[2].request_id)          # decoding
    while engine.has_unfinished():
        engine.step()
    assert [r.finish_reason for r in requests[:3]] == ["abort"] * 3
    assert_all_free(engine)


def test_requests_that_can_never_run_are_rejected(params):
    engine = make_engine(params, max_model_len=512)
    with pytest.raises(ValueError, match="leaves no room to generate under max_model_len 512"):
        engine.add_request(random_prompt(512, 0), GREEDY)
    with pytest.raises(ValueError, match="token id 600 is outside the vocabulary"):
        engine.add_request([1, 600], GREEDY)
    strict = make_engine(params, enable_chunked_prefill=False, max_model_len=256,
                         long_prefill_token_threshold=256)
    with pytest.raises(ValueError, match=r"prompt of 300 tokens exceeds one prefill dispatch "
                                         r"\(256\) and chunked prefill is disabled"):
        strict.add_request(random_prompt(300, 0), GREEDY)
    with pytest.raises(ConfigError, match="--no-enable-chunked-prefill needs max_model_len"):
        make_engine(params, enable_chunked_prefill=False)


def test_preempted_requests_come_back_with_a_new_slot_generation(params):
    """Slot reuse after preemption bumps the generation, and the device slot always
    carries its current owner's generation, so a stale step is recognisable (the fused
    decode kernel skips such rows: tests/model/test_reference.py)."""
    prompts = [random_prompt(120, i) for i in range(64)]
    tight = capacity.bytes_for(REF.pools.GROUPS, 8, 128 * 8, copies(1))
    engine = make_engine(params, num_speculative_tokens=1, kv_cache_memory=tight,
                         max_model_len=1024, backend="compiled-eager")
    handed: dict[tuple[int, int], list[int]] = {}
    acquire = engine.scheduler.slots.acquire

    def watched(rank):
        slot, generation = acquire(rank)
        handed.setdefault((rank, slot), []).append(generation)
        return slot, generation

    engine.scheduler.slots.acquire = watched
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        for rank, running in enumerate(engine.scheduler.running):
            for request in running:
                if request.output_ids and not request.prefilling:
                    device = engine.executor.mtp.slots[rank, request.slot]
                    assert int(device[REF.pools.MtpField.GENERATION]) \
                        == request.slot_generation
    assert engine.scheduler.num_preemptions > 0
    assert any(len(gens) > 1 for gens in handed.values())
    assert all(gens == sorted(set(gens)) for gens in handed.values())
    assert_all_free(engine)


def test_the_seed_in_sampling_params_makes_a_request_repeatable(params):
    """SamplingParams.seed is the request's stream: the same seed gives the same tokens
    (alone or beside other requests), another seed or none gives others."""
    engine = make_engine(params)
    prompt = random_prompt(40, 7)

    def run(seed, company: int = 0) -> list[int]:
        params_ = SamplingParams(temperature=1.0, seed=seed, max_tokens=16, ignore_eos=True)
        others = [random_prompt(30 + i, i) for i in range(company)]
        outs = engine.generate([prompt, *others], params_)
        return outs[0].output_ids

    first = run(5)
    assert run(5) == first and run(5, company=5) == first
    assert run(6) != first
    assert run(None) != run(None)
    assert_all_free(engine)


def test_a_logit_bias_is_written_once_per_request_and_steers_every_step(params,
                                                                         monkeypatch):
    """A full-vocabulary bias becomes the request's dense row once, when it gets its
    state slot, not once per step (runtime/sampling/sampling_state.py)."""
    from runtime.sampling.sampling_state import SamplingState

    writes, real = [], SamplingState._set_bias

    def counted(self, state, bias):
        writes.append(len(bias))
        real(self, state, bias)

    monkeypatch.setattr(SamplingState, "_set_bias", counted)
    engine = make_engine(params)
    favoured = 77
    bias = tuple((t, 100.0 if t == favoured else -1.0) for t in range(512))
    [out] = engine.generate([random_prompt(30, 1)], SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, logit_bias=bias))
    assert out.output_ids == [favoured] * 12
    assert writes == [512]
    assert_all_free(engine)


@pytest.mark.parametrize("k", [0, 1])
def test_an_engine_core_sends_as_deltas_what_the_outputs_carry(params, k):
    """An engine built without outputs (an engine core's: the server makes them) steps
    to the same tokens and finishes, as deltas, and holds nothing after."""
    prompts = [random_prompt(n, seed) for seed, n in enumerate([5, 140, 33, 90])]
    sampled = [SamplingParams(temperature=0.9, seed=seed, max_tokens=6 + 3 * seed,
                              stop_token_ids=[7]) for seed in range(len(prompts))]
    outputs = make_engine(params, num_speculative_tokens=k)
    core = make_engine(params, outputs=False, num_speculative_tokens=k)
    got = {}
    for engine in (outputs, core):
        for i, (prompt, p) in enumerate(zip(prompts, sampled)):
            engine.add_request(prompt, p, request_id=f"r{i}")
    while outputs.has_unfinished():
        for out in outputs.step():
            got.setdefault(out.request_id, [[], None])[0].extend(out.new_ids)
            got[out.request_id][1] = out.finish_reason
    sent = {}
    while core.has_unfinished():
        for delta in core.step_deltas():
            sent.setdefault(delta.request_id, [[], None])[0].extend(delta.new_ids)
            sent[delta.request_id][1] = delta.finish_reason
    assert sent == got and len(got) == len(prompts)
    assert_all_free(core)
