"""`v4serve plan` for DeepSeek V4.1: it runs for v41-tiny and deepseek-v41-flash; the
Engram tables' bytes per rank in each placement equal rows x head_dim x (1 + 1/32)
(fp8 with an e8m0 byte per 32), sharded by row range on the device or whole once per
node on the host; moving them to the host gives the cache more tokens per rank on
8 x H200 and 8 x B200; V4.1's FP8 projections weigh their 32 x 32 scale blocks; a V4
plan is what it was and ignores the placement."""
from __future__ import annotations

import json

import pytest

import generated
from contract.checkpoint_layout import expected_shapes, is_engram_table, is_routed_expert
from contract.model_args import ModelArgs
from runtime.core.config import EngineConfig
from runtime.planning.admission import Admission, ConfigError
from runtime.planning.memory_plan import weight_bytes
from runtime.planning.plan_report import plan, render
from server.cli import main

GIB = 2**30
FLASH41, TINY41, FLASH4 = (generated.load(n) for n in
                           ("deepseek_v41_flash", "v41_tiny", "deepseek_v4_flash"))
H200, B200 = 139 * GIB, 178 * GIB          # usable device memory as the devices report it


def _config(spec, memory: int | None, placement: str = "host", **limits) -> EngineConfig:
    return EngineConfig(spec=spec.SPEC_NAME, device_memory=memory,
                        engram_placement=placement, **limits)


def _engram_rows(spec) -> list[int]:
    return list(spec.architecture.CONFIG["engram_num_embeddings"])


def _row_bytes(spec) -> float:
    """fp8 e4m3 values and an e8m0 scale byte per 32 of them."""
    return spec.architecture.CONFIG["engram_head_dim"] * (1 + 1 / 32)


@pytest.mark.parametrize("name, memory", [("v41-tiny", "1GiB"), ("deepseek-v41-flash", "139GiB"),
                                          ("deepseek-v41-flash", "178GiB")])
@pytest.mark.parametrize("placement", ["device", "host"])
def test_the_plan_runs_for_v41_specs_in_either_placement(name, memory, placement, capsys):
    assert main(["plan", "--spec", name, "--device-memory", memory,
                 "--engram-placement", placement, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fits"] and got["tokens_per_rank"] >= got["max_model_len"]
    assert set(got["pools"]) == {"ori", "cmp_c1", "cmp_c2", "idx_c1", "idx_c2", "state_c2"}
    assert got["engram"]["placement"] == placement
    assert got["workspace_rehearsed"] is False
    assert main(["plan", "--spec", name, "--device-memory", memory,
                 "--engram-placement", placement]) == 0
    text = capsys.readouterr().out
    assert f"placement {placement} (--engram-placement)" in text
    assert f"{got['tokens_per_rank']:,} tokens per rank" in text


@pytest.mark.parametrize("spec", [TINY41, FLASH41], ids=["v41-tiny", "deepseek-v41-flash"])
def test_engram_bytes_per_rank_in_each_placement(spec):
    ranks = spec.contract.RANKS
    rows = _engram_rows(spec)
    whole = sum(rows) * _row_bytes(spec)
    shard = sum(-(-r // ranks) for r in rows) * _row_bytes(spec)   # row ranges, ceil
    got = plan(_config(spec, 200 * GIB), spec)["engram"]
    assert got["table_bytes"] == whole
    assert got["placements"]["device"]["device_bytes_per_rank"] == shard
    assert got["placements"]["device"]["host_bytes_per_node"] == 0
    assert got["placements"]["host"]["device_bytes_per_rank"] == 0
    assert got["placements"]["host"]["host_bytes_per_node"] == whole
    assert abs(shard - whole / ranks) < len(rows) * _row_bytes(spec)
    for placement, held in (("device", shard), ("host", 0)):
        w = plan(_config(spec, 200 * GIB, placement), spec)["weight_bytes_per_rank"]
        assert w["engram"] == held and w["total"] == w["dense"] + w["experts"] + held


def test_v41_flash_figures():
    """188.83 GiB of tables; 23.60 GiB of them per rank on the device."""
    got = plan(_config(FLASH41, H200), FLASH41)["engram"]
    assert round(got["table_bytes"] / GIB, 2) == 188.83
    assert round(got["placements"]["device"]["device_bytes_per_rank"] / GIB, 2) == 23.60


@pytest.mark.parametrize("memory", [H200, B200], ids=["8xH200", "8xB200"])
def test_tables_on_the_host_leave_the_cache_more_tokens_per_rank(memory):
    on_device, on_host = (Admission.plan(_config(FLASH41, memory, p, max_model_len=1048576),
                                         FLASH41) for p in ("device", "host"))
    assert on_host.capacity.tokens > on_device.capacity.tokens >= 1048576
    moved = on_device.memory.weights.engram
    assert on_host.memory.pool_budget - on_device.memory.pool_budget == moved > 0
    # the report's per-placement figures are the admissions of each placement
    report = plan(_config(FLASH41, memory, "host", max_model_len=1048576), FLASH41)
    figures = report["engram"]["placements"]
    assert figures["host"]["tokens_per_rank"] == on_host.capacity.tokens
    assert figures["device"]["tokens_per_rank"] == on_device.capacity.tokens
    assert figures["device"]["pool_budget_per_rank"] == on_device.memory.pool_budget


def test_a_placement_that_does_not_fit_says_so_beside_one_that_does():
    """On 80 GiB devices the sharded tables leave no room for a 1M-token request; on the
    host they do."""
    config = _config(FLASH41, 80 * GIB, "device", max_model_len=1048576)
    with pytest.raises(ConfigError):
        Admission.plan(config, FLASH41)
    got = plan(config, FLASH41)
    assert got["fits"] is False
    figures = got["engram"]["placements"]
    assert figures["device"]["fits"] is False and figures["device"]["shortfall_per_rank"] > 0
    assert figures["host"]["fits"] is True
    assert "does not fit" in render(got)


def test_v41_fp8_projections_weigh_32_by_32_scale_blocks():
    """Held as released, each V4.1 FP8 projection takes a byte a value and one per 32 x 32
    block; everything else weighs as when unquantized."""
    args = ModelArgs.from_config(FLASH41.architecture.CONFIG)
    bf16 = _declaring(FLASH41, dense="unquantized")
    saved = 0
    for name, (rows, cols) in ((n, s) for n, s in expected_shapes(args).items()
                               if n.endswith(".weight") and len(s) == 2
                               and not is_routed_expert(n) and not is_engram_table(n)):
        if any(name.endswith(p) for p in (".attn.wq_a.weight", ".attn.wq_b.weight",
                                          ".attn.wkv.weight", ".attn.wo_b.weight",
                                          ".indexer.wq_b.weight", ".engram.wkv.weight",
                                          ".shared_experts.w1.weight", ".shared_experts.w2.weight",
                                          ".shared_experts.w3.weight", ".main_proj.weight")):
            saved += 2 * rows * cols - (rows * cols + -(-rows // 32) * -(-cols // 32))
    assert weight_bytes(bf16).dense - weight_bytes(FLASH41).dense == saved > 0


def test_the_planned_dense_weights_of_v41_tiny_are_what_the_loader_holds():
    """Every dense tensor but the Engram tables (placed apart) weighs what the loaded one
    does; the routed experts are each layer's count over the ranks (DSpark stages
    have 4, the backbone 8)."""
    from runtime.weights.loader import load_params
    from tests.conftest import REPO

    params = load_params(REPO / "tests" / "fixtures" / "v41-tiny", TINY41)
    dense = sum(t.numel() * t.element_size() for n, t in params.dense.items()
                if not is_engram_table(n))
    planned = weight_bytes(TINY41)
    assert planned.dense == dense
    args, ranks = ModelArgs.from_config(TINY41.architecture.CONFIG), TINY41.contract.RANKS
    expert = 3 * args.moe_inter * args.dim * 4                  # w1, w2, w3 in float32
    layers = range(args.n_layers + args.n_mtp_layers)
    assert planned.experts == sum(args.experts(lay) for lay in layers) * expert // ranks


@pytest.mark.parametrize("memory", [141 * GIB, 139 * GIB])
def test_a_v4_plan_is_unchanged_and_ignores_the_placement(memory):
    """V4-Flash's figures before V4.1 (25.63 GiB of weights, 2 GiB of workspace) and no
    Engram key; --engram-placement changes nothing."""
    host, device = (plan(_config(FLASH4, memory, p), FLASH4) for p in ("host", "device"))
    assert host == device and "engram" not in host and "workspace_rehearsed" not in host
    assert set(host["weight_bytes_per_rank"]) == {"dense", "experts", "total"}
    assert set(host["released"]) == {"dense", "experts"}
    assert round(host["weight_bytes_per_rank"]["total"] / GIB, 2) == 25.63
    assert host["workspace_bytes"] == 2 * GIB
    if memory == 139 * GIB:
        assert host["tokens_per_rank"] == 13_731_840


def test_an_unknown_placement_is_refused():
    with pytest.raises(ConfigError, match="--engram-placement 'gpu': one of device, host"):
        Admission.plan(_config(FLASH41, H200, "gpu"), FLASH41)


def _declaring(spec, dense: str):
    """A copy of a generated package whose weights section declares `dense`."""
    import types

    copy = types.SimpleNamespace(**{k: getattr(spec, k) for k in ("architecture", "pools",
                                                                   "SPEC_NAME", "SPEC_PATH")})
    copy.contract = types.SimpleNamespace(**{k: getattr(spec.contract, k)
                                             for k in dir(spec.contract)
                                             if not k.startswith("__")})
    copy.contract.WEIGHTS_DENSE = dense
    return copy



def test_kv_cache_dtype_fp8_reads_v41s_compressed_kv_groups(capsys):
    """deepseek-v41-flash stores its cmp_c<r> groups in fp4_16: fp8 serves it as it is;
    v41-tiny stores them as computed and has no -fp8 variant: refused with V4.1's
    formats."""
    from server.cli.spec_check import served

    assert served("deepseek-v41-flash", "fp8").SPEC_NAME == "deepseek-v41-flash"
    assert main(["plan", "--spec", "v41-tiny", "--kv-cache-dtype", "fp8",
                 "--device-memory", "1GiB"]) == 2
    assert "(fp8_32 for ori, fp4_16 for cmp_c<r>, fp4_32 for idx_c<r>)" \
        in capsys.readouterr().err
