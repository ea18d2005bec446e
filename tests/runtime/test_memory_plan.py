"""The memory plan and `v4serve plan`: weight bytes from the spec alone equal what the
loader holds; V4-Pro on 4 x 192 GB does not fit and says by how much; V4-Flash on
8 x 141 GiB gives tokens per rank and 1M-token concurrency equal to the engine's own
admission plan; a server started with the same flags reports the same figures."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import httpx
import pytest

import generated
from bench.quantize import quantize_checkpoint
from runtime.core.config import EngineConfig
from runtime.planning import capacity
from runtime.planning.admission import Admission, ConfigError
from runtime.planning.memory_plan import MemoryPlan, parse_bytes, weight_bytes
from runtime.weights.loader import bytes_per_rank, load_params
from tests.conftest import REPO
from tests.model.support import FIXTURE, REF

FLASH, PRO, TINY = (generated.load(n) for n in ("deepseek_v4_flash", "deepseek_v4_pro", "tiny"))
GIB = 2**30


def _declaring(spec, dense: str, experts: str) -> types.SimpleNamespace:
    """A copy of a generated spec package whose weights section says otherwise."""
    copy = types.SimpleNamespace(**{k: getattr(spec, k) for k in dir(spec)
                                    if not k.startswith("__")})
    copy.contract = types.SimpleNamespace(**{k: getattr(spec.contract, k)
                                             for k in dir(spec.contract)
                                             if not k.startswith("__")})
    copy.contract.WEIGHTS_DENSE, copy.contract.WEIGHTS_EXPERTS = dense, experts
    return copy


def _plan(*flags: str) -> tuple[int, dict]:
    """`v4serve plan --json` as a user runs it: (exit status, figures)."""
    done = subprocess.run([sys.executable, "-m", "server.cli", "plan", "--json", *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_sizes_read_as_bytes():
    assert parse_bytes("141GiB") == 141 * GIB and parse_bytes("192GB") == 192 * 10**9
    assert parse_bytes("1.5 MiB") == 3 * 2**19 and parse_bytes("4096") == 4096
    with pytest.raises(ValueError, match="a number and a unit"):
        parse_bytes("lots")


def test_weight_bytes_from_the_spec_equal_what_the_loader_holds(tmp_path):
    tiny = load_params(REPO / "models" / "tiny", TINY)
    assert weight_bytes(TINY).total == bytes_per_rank(tiny)
    # the reference fixture quantized as the release is, under a spec saying so
    released = load_params(quantize_checkpoint(FIXTURE, tmp_path / "q"), REF)
    spec = _declaring(REF, dense="fp8", experts="fp4")
    assert weight_bytes(spec).total == bytes_per_rank(released)
    assert weight_bytes(spec).total < weight_bytes(REF).total / 2


def test_v4_pro_on_four_192_gb_devices_does_not_fit_and_says_by_how_much():
    status, got = _plan("--spec", "deepseek-v4-pro", "--device-memory", "192GB", "--ranks", "4")
    assert status == 1 and got["fits"] is False and got["ranks"] == 4
    config = EngineConfig(spec="deepseek_v4_pro", device_memory=192 * 10**9)
    with pytest.raises(ConfigError, match="does not fit"):
        Admission.plan(config, PRO, ranks=4)
    limits = Admission.plan(EngineConfig(spec="deepseek_v4_pro"), PRO).limits
    memory = MemoryPlan.of(PRO, 192 * 10**9, 0.9, limits, ranks=4)
    pools = capacity.bytes_for(PRO.pools.GROUPS, limits.max_running_per_rank,
                               capacity.tokens_for(PRO.pools.GROUPS, 1, limits.max_model_len),
                               Admission.plan(EngineConfig(spec="deepseek_v4_pro"), PRO)
                               .layout.copies)
    short = memory.weights.total + memory.workspace + pools - memory.usable
    assert got["shortfall_per_rank"] == short > 40 * GIB
    assert got["shortfall_per_replica"] == 4 * short
    assert got["weight_bytes_per_rank"]["experts"] == 2 * weight_bytes(PRO).experts
    assert got["experts_per_rank"] == PRO.architecture.CONFIG["n_routed_experts"] // 4


def test_v4_flash_on_eight_141_gib_devices_equals_the_engines_own_plan():
    status, got = _plan("--spec", "deepseek-v4-flash", "--device-memory", "141GiB",
                        "--max-model-len", "1048576")
    assert status == 0 and got["fits"] and got["ranks"] == 8
    admission = Admission.plan(EngineConfig(spec="deepseek_v4_flash", device_memory=141 * GIB,
                                            max_model_len=1048576), FLASH)
    assert got["tokens_per_rank"] == admission.capacity.tokens > 1048576
    assert got["max_concurrency"] == admission.concurrency() > 8
    assert got["pool_bytes_per_rank"] == admission.capacity.bytes
    w = got["weight_bytes_per_rank"]
    assert w["dense"] + w["experts"] + got["workspace_bytes"] + got["pool_bytes_per_rank"] \
        <= got["usable_bytes"] == int(141 * GIB * 0.9)
    text = subprocess.run([sys.executable, "-m", "server.cli", "plan", "--spec",
                           "deepseek-v4-flash", "--device-memory", "141GiB",
                           "--max-model-len", "1048576"], cwd=REPO, capture_output=True,
                          text=True, timeout=120).stdout
    assert f"{admission.capacity.tokens:,} tokens per rank" in text
    assert f"{admission.concurrency()} requests of 1,048,576 tokens" in text


@pytest.mark.parametrize("spec, ceiling", [("deepseek-v4-flash", 3.43), ("deepseek-v4-pro", 4.92)])
def test_the_served_entry_formats_cost_what_v4_is_served_with(spec, ceiling):
    """fp8_ds main entries (584 bytes for a 512-wide head) and FP4 indexer keys (68): the
    full groups' bytes per 1M tokens of context at most the served formats' figure."""
    status, got = _plan("--spec", spec, "--device-memory", "200GiB")
    assert status == 0 and got["fits"]
    pools = got["pools"]
    assert {g: (pools[g]["format"], pools[g]["entry_bytes"]) for g in
            ("ori", "cmp_c4", "cmp_c128", "idx")} == {
        "ori": ("fp8_ds", 584), "cmp_c4": ("fp8_ds", 584), "cmp_c128": ("fp8_ds", 584),
        "idx": ("fp4", 68)}
    layers = len(generated.load(spec).pools.GROUPS["cmp_c4"].layers)
    assert pools["cmp_c4"]["bytes_per_token"] == layers * 584 / 4     # an entry per 4 tokens
    per_million = got["full_group_bytes_per_million_tokens"]
    assert per_million == sum(p.get("bytes_per_million_tokens", 0) for p in pools.values())
    assert round(per_million / GIB, 2) <= ceiling


def test_more_memory_holds_more_tokens_and_more_ranks_hold_fewer_experts_each():
    config = EngineConfig(spec="deepseek_v4_flash", max_model_len=1048576)
    small, big = (Admission.plan(EngineConfig(**{**config.__dict__, "device_memory": m}), FLASH)
                  for m in (141 * GIB, 180 * GIB))
    assert big.capacity.tokens > small.capacity.tokens
    four = Admission.plan(EngineConfig(**{**config.__dict__, "device_memory": 141 * GIB}),
                          FLASH, ranks=4)
    assert four.memory.weights.experts == 2 * small.memory.weights.experts
    assert four.capacity.tokens < small.capacity.tokens


@pytest.mark.slow
def test_a_server_reports_and_logs_the_plan_of_the_same_flags():
    from tests.server.support import ServerProcess

    flags = ("--device-memory", "640MiB", "--gpu-memory-utilization", "0.8",
             "--max-model-len", "2048")
    status, want = _plan("--spec", "reference", *flags)
    assert status == 0
    with ServerProcess(*flags) as server:
        info = httpx.get(f"{server.url}/server_info").json()
    log = server.proc.stderr.read()
    assert info["memory_plan"] == want
    assert info["pool_capacity"]["tokens_per_rank"] == want["tokens_per_rank"]
    assert info["pool_capacity"]["max_concurrency"] == want["max_concurrency"]
    assert info["param_bytes_per_rank"] == want["weight_bytes_per_rank"]["total"]
    assert f"{want['tokens_per_rank']:,} tokens per rank" in log
    assert "plan: workspace" in log


def test_a_checkpoint_heavier_than_the_spec_says_is_refused_before_the_pools():
    """A spec that declares FP8/FP4 weights over a checkpoint stored unquantized would
    size its pools around weights four times lighter than those loaded."""
    light = _declaring(REF, dense="fp8", experts="fp4")
    config = EngineConfig(spec="reference", device_memory=2**30, max_model_len=2048)
    loaded = bytes_per_rank(load_params(FIXTURE, REF))
    Admission.plan(config, REF).check_weights(loaded)                  # as declared: fine
    with pytest.raises(ConfigError, match="the checkpoint holds .* GiB per rank where spec "
                                          "specs/reference.yaml plans .* it overruns"):
        Admission.plan(config, light).check_weights(loaded)
    # pools made small by hand leave the heavier weights room: no refusal
    small = EngineConfig(**{**config.__dict__, "kv_cache_memory": 64 * 2**20})
    Admission.plan(small, light).check_weights(loaded)
