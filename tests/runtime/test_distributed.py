"""Ranks as processes (--distributed-executor-backend mp): node layout and ports, each
rank's weights, and eight gloo workers (one thread each) giving the outputs of the
single-process engine: code prompts, chunked prefill, preemption, 64 at once, MTP on and
off, and over two "nodes" on one machine. (What a step sends the ranks, and each rank's
share of it: test_step_plan.py.)"""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import generated
from runtime.core.config import EngineConfig
from runtime.core.prefix_cache import Layout
from runtime.core.sampling_params import SamplingParams
from runtime.engine.engine import Engine
from runtime.executor.workers import free_port, node_ranks, resolve
from runtime.planning import capacity
from runtime.planning.admission import ConfigError
from runtime.text.grammar import StructuredOutputs
from runtime.weights.loader import bytes_per_rank, load_params
from server.cli.spec_check import default_model
from tests.conftest import REPO
from tests.runtime.engine_support import assert_all_free, random_prompt

TINY = generated.load("tiny")
MODEL = default_model("tiny")
CODE = [line for line in (REPO / "bench/code_prompts.txt").read_text().splitlines()
        if line.strip()]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# a constraint: each rank's runner keeps its own requests' matchers and draft masks
CHOICE = SamplingParams(temperature=0, max_tokens=12, structured=StructuredOutputs(
    regex="(yes|no|maybe)( (yes|no|maybe)){0,5}"))


def test_node_layout_and_ports_are_checked():
    assert node_ranks(8, 2, 1) == range(4, 8)
    with pytest.raises(ValueError, match="divide"):
        node_ranks(8, 3, 0)
    with pytest.raises(ValueError, match="node-rank"):
        node_ranks(8, 2, 2)
    with pytest.raises(ValueError, match="master-port"):
        resolve(EngineConfig(nnodes=2))
    assert resolve(EngineConfig()).master_port > 0


def test_mp_needs_the_compiled_backend_and_nnodes_needs_mp():
    with pytest.raises(ConfigError, match="one process only"):
        Engine.build(EngineConfig(spec="reference", model=REPO / "tests/fixtures/v4-tiny",
                                  distributed_executor_backend="mp"))
    with pytest.raises(ConfigError, match="needs --distributed-executor-backend mp"):
        Engine.build(EngineConfig(model=MODEL, nnodes=2))


def test_a_rank_holds_the_replicated_weights_and_its_own_experts_only():
    whole = load_params(MODEL, TINY)
    args, per = whole.args, whole.args.n_experts // TINY.contract.EP
    expert = sum(e.w13[0].nbytes + e.w2[0].nbytes for e in whole.experts.values())
    dense = bytes_per_rank(whole) - per * expert
    for rank in (0, 5):
        mine = load_params(MODEL, TINY, held=range(rank, rank + 1))
        for layer, experts in mine.experts.items():
            assert experts.count == per and experts.first == rank * per
            assert torch.equal(experts.w13, whole.experts[layer].w13[rank * per:][:per])
        assert bytes_per_rank(mine) == dense + per * expert
        assert sum(e.w13.nbytes + e.w2.nbytes for e in mine.experts.values()) \
            == per * expert
    assert args.n_experts == TINY.contract.EP * per


# -- eight workers against one process ---------------------------------------------------

def _config(k: int, executor: str, **more) -> EngineConfig:
    running = 8 if k else 16
    copies = Layout.of(TINY.pools.GROUPS, TINY.architecture.CONFIG, 128, k).copies
    tight = capacity.bytes_for(TINY.pools.GROUPS, running, 128 * 8, copies)  # 64 preempt
    return EngineConfig(spec="tiny", model=MODEL, num_speculative_tokens=k,
                        enforce_eager=True, long_prefill_token_threshold=128,
                        kv_cache_memory=tight, max_model_len=1024, worker_threads=1,
                        distributed_executor_backend=executor, **more)


def _workload(k: int) -> list[tuple[list[str | list[int]], SamplingParams]]:
    """Code prompts, constrained ones; with MTP (the suite's time allows one K) also
    prompts chunked at 128 (crossing tile and block edges), a prompt that hits the cached
    blocks of the 600-token one, and 64 at once, which preempt under the tight pools."""
    if not k:
        return [(CODE, GREEDY), (CODE, CHOICE)]
    shared = random_prompt(600, 600)
    return [(CODE, GREEDY), (CODE, CHOICE),
            ([random_prompt(n, n) for n in (127, 129, 257, 600)], GREEDY),
            ([shared[:450] + random_prompt(9, 450)], GREEDY),
            ([random_prompt(120, i) for i in range(64)],
             SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))]


@pytest.fixture(scope="module", params=[0, 1], ids=["mtp-off", "mtp-on"])
def runs(request):
    """(single-process outputs, mp outputs, mp engine) of the workload, per K."""
    k, outputs, hits = request.param, {}, {}
    for executor in ("uni", "mp"):
        engine = Engine.build(_config(k, executor))
        try:
            outputs[executor] = [[o.output_ids for o in engine.generate(p, s)]
                                 for p, s in _workload(k)]
            info, preempted = engine.summary(), engine.scheduler.num_preemptions
            hits[executor] = engine.prefix_cache_info()["hits"]
            assert_all_free(engine)
        finally:
            engine.close()
    return outputs["uni"], outputs["mp"], info, preempted, hits


@pytest.mark.slow
def test_eight_gloo_workers_give_the_single_process_outputs(runs):
    uni, mp, _, preempted, hits = runs
    for part, (one, many) in enumerate(zip(uni, mp)):
        assert many == one, f"workload part {part}"
    assert all(uni[1])                        # the constrained prompts ran, not failed
    assert preempted > 0 or len(uni) < 4      # the 64 prompts were preempted and resumed
    assert hits["mp"] == hits["uni"] and (hits["mp"] > 0 or len(uni) < 4)   # prefix hits


@pytest.mark.slow
def test_every_rank_reports_its_process_device_and_bytes(runs):
    info = runs[2]
    ranks = info["processes"]
    assert [r["rank"] for r in ranks] == list(range(8))
    assert len({r["pid"] for r in ranks}) == 8
    mine = bytes_per_rank(load_params(MODEL, TINY, held=range(3, 4)))
    assert {r["param_bytes"] for r in ranks} == {mine} and info["executor"] == "mp"
    assert all(r["device"] == "cpu" for r in ranks)


@pytest.mark.slow
def test_two_nodes_on_one_machine_give_the_same_outputs():
    port = free_port()
    flags = ["--spec", "tiny", "--enforce-eager", "--distributed-executor-backend", "mp",
             "--nnodes", "2", "--master-port", str(port), "--num-speculative-tokens", "0"]
    other = subprocess.Popen([sys.executable, "-m", "server.cli", "generate",
                              "--node-rank", "1", *flags], cwd=REPO)
    try:
        engine = Engine.build(EngineConfig(model=MODEL, num_speculative_tokens=0,
                                           enforce_eager=True, nnodes=2, master_port=port,
                                           worker_threads=1,
                                           distributed_executor_backend="mp"))
        try:
            two = [o.output_ids for o in engine.generate(CODE, GREEDY)]
        finally:
            engine.close()
        assert other.wait(30) == 0                 # node 1's ranks end with the engine
    finally:
        if other.poll() is None:
            other.kill()
    one = Engine.build(EngineConfig(model=MODEL, num_speculative_tokens=0, enforce_eager=True))
    assert two == [o.output_ids for o in one.generate(CODE, GREEDY)]


def test_the_all_to_all_moe_equals_the_local_one_on_a_group_of_one(tmp_path):
    """ep_moe's dispatch (sort, counts, exchange), grouped experts and combine, on a
    one-rank gloo group holding every expert: the same sums as the local MoE."""
    import torch.distributed as dist

    from runtime.backends.compiled import expert_parallel
    from runtime.backends.compiled.moe import routed

    gen = torch.Generator().manual_seed(0)
    x, w13, w2 = (torch.randn(*shape, generator=gen) for shape in
                  ((37, 16), (8, 2 * 12, 16), (8, 16, 12)))
    chosen = torch.randint(0, 8, (37, 2), generator=gen)
    weights = torch.rand(37, 2, generator=gen)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        expert_parallel.enable(dist.group.WORLD)
        got = expert_parallel.ep_moe(x, chosen, weights, w13, w2, 10.0, [])
    finally:
        expert_parallel.enable(None)
        dist.destroy_process_group()
    torch.testing.assert_close(got, routed(x, chosen, weights, w13, w2, 10.0))


@pytest.mark.slow
def test_rank_processes_defer_missing_graphs_and_say_so(tmp_path, monkeypatch):
    """serve and generate defer compiling: on an empty cache the rank processes run
    each graph eagerly (in step, their collectives pair as compiled ones would), start at
    once instead of each compiling every graph, and report what waits for a compile."""
    monkeypatch.setenv("V4SERVE_CACHE_DIR", str(tmp_path))
    prompts = CODE[:2]
    eager = Engine.build(_config(0, "uni"))
    try:
        want = [o.output_ids for o in eager.generate(prompts, GREEDY)]
    finally:
        eager.close()
    engine = Engine.build(dataclasses.replace(_config(0, "mp"), enforce_eager=False,
                                              backend="compiled", defer_compile=True))
    try:
        assert engine.pending_graphs() > 0
        assert {r["pending_graphs"] for r in engine.summary()["processes"]} == \
            {engine.pending_graphs()}
        assert [o.output_ids for o in engine.generate(prompts, GREEDY)] == want
    finally:
        engine.close()
    assert not list(tmp_path.glob("graphs/*/*.aot"))         # nothing compiled meanwhile
