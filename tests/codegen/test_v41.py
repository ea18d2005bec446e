"""DeepSeek V4.1 specs: validated (every inconsistent source names file, line and field),
planned (CSA2's pool groups, bytes per token) and generated with the launch wrappers it
serves: the main prefill and the K=0 decode with each row's Engram history, on the torch
backend, the contract saying where that differs from what the spec asks."""
from __future__ import annotations

import pytest

from codegen.errors import SpecError
from codegen.pipeline import generate, load_spec, plan_spec
from tests.conftest import REPO, SPECS, import_fresh, line_of, replace_once


@pytest.fixture(scope="module")
def v41_text() -> str:
    return (SPECS / "v41-tiny.yaml").read_text()


@pytest.fixture(scope="module")
def plans():
    return {name: plan_spec(SPECS / f"{name}.yaml", REPO)
            for name in ("v41-tiny", "deepseek-v41-flash", "deepseek-v4-flash")}


def _pool(plan, name):
    return next(p for p in plan.pools if p.name == name)


def _errors(tmp_path, text: str) -> list[str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path, root=tmp_path)
    return str(info.value).splitlines()


def _refused(tmp_path, text, old, new, needle, field, message):
    """`old` -> `new` in the v41-tiny spec is refused with this line among its errors."""
    edited = replace_once(text, old, new)
    want = f"bad.yaml:{line_of(edited, needle)}: {field}: {message}"
    errors = _errors(tmp_path, edited)
    assert want in errors, "\n".join(errors)


KV = "  kv_source_layer_ids: [2, 4, 6]"
INDEX = "  index_source_layer_ids: [2, 4, 6, 8]"
RATIOS = "  compress_ratios: [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0]"


@pytest.mark.parametrize(("old", "new", "needle", "field", "message"), [
    (KV, "  kv_source_layer_ids: [1, 4, 6]", "kv_source_layer_ids:",
     "model.kv_source_layer_ids[0]",
     "layer 1 has compress ratio 0: a kv source owns a compressor, so its ratio must be "
     "positive"),
    (KV, "  kv_source_layer_ids: [2, 3, 4, 6]", "kv_source_layer_ids:",
     "model.kv_source_layer_ids[1]",
     "layer 3 is not in index_source_layer_ids: a kv source's index keys are scored by its "
     "own indexer"),
    (INDEX, "  index_source_layer_ids: [2, 4, 6, 8, 9, 9]", "index_source_layer_ids:",
     "model.index_source_layer_ids[5]", "9 follows 9: list each layer once, ascending"),
    (RATIOS, "  compress_ratios: [0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0]", "compress_ratios:",
     "model.compress_ratios[1]",
     "layer 1 has ratio 2 but no kv source at or below it (kv_source_layer_ids [2, 4, 6]): "
     "its compressed KV would come from nowhere"),
    (RATIOS, "  compress_ratios: [0, 0, 2, 2, 2, 2, 1, 2, 1, 1, 0, 0, 0]", "compress_ratios:",
     "model.compress_ratios[7]",
     "layer 7 has ratio 2 but reads kv source 6 of ratio 1: a layer reads its source's "
     "entries, so their ratios must agree"),
    (RATIOS, "  compress_ratios: [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 2, 0]", "compress_ratios:",
     "model.compress_ratios[11]", "DSpark stage 11 must be window only (0), not 2"),
    ("  candidate_source_layer_id: 6 ", "  candidate_source_layer_id: 8 ",
     "candidate_source_layer_id:", "model.candidate_source_layer_id",
     "8 is not a kv source ([2, 4, 6]): the candidate blocks come from a Full layer's own "
     "scores"),
    ("  candidate_topk_blocks: 4", "  candidate_topk_blocks: 2", "candidate_topk_blocks:",
     "model.candidate_topk_blocks",
     "(2 - 1) * candidate_block_size 8 + 1 = 9 is below index_topk 16: an indexer above the "
     "candidate source would select entries outside its candidate blocks"),
    ("  engram_layer_ids: [1, 4]", "  engram_layer_ids: [1, 12]", "engram_layer_ids:",
     "model.engram_layer_ids[1]", "12 is not a backbone layer (0..9)"),
    ("  engram_num_embeddings: [1040, 1786]", "  engram_num_embeddings: [1040]",
     "engram_num_embeddings:", "model.engram_num_embeddings",
     "has 1 entries; need one per engram_layer_ids entry (2)"),
    ("  engram_num_embeddings: [1040, 1786]", "  engram_num_embeddings: [1040, 1787]",
     "engram_num_embeddings:", "model.engram_num_embeddings[1]",
     "1787 must be the sum of layer 4's hash primes, 1786 (engram_vocab_size 61, 4 heads, "
     "n-grams 2..4)"),
    ("  dspark_target_layer_ids: [7, 8, 9]", "  dspark_target_layer_ids: [7, 8, 10]",
     "dspark_target_layer_ids:", "model.dspark_target_layer_ids[2]",
     "10 is not a backbone layer (0..9)"),
    ("  dspark_n_routed_experts: 4", "  dspark_n_routed_experts: 6", "  ep: 4",
     "topology.ep", "4 does not divide dspark_n_routed_experts 6"),
    ("  dspark_block_size: 5", "  dspark_block_size: 2", "  num_speculative_tokens:",
     "decode.num_speculative_tokens[3]",
     "K=3 exceeds dspark_block_size 2: a DSpark block drafts 2 tokens"),
])
def test_inconsistent_sources_are_refused_at_their_line(tmp_path, v41_text, old, new, needle,
                                                        field, message):
    _refused(tmp_path, v41_text, old, new, needle, field, message)


def test_pool_groups_follow_the_kv_sources(tmp_path, v41_text):
    state = "    state_c2: {layers: [full], rows_per_page: 2, row_width: 128"
    line = state + ", dtype: float32, policy: ring}\n"
    _refused(tmp_path, v41_text, line, "", "  groups:", "pools.groups",
             "missing group state_c2 (ratio-2 compressor state: the open group's kv and "
             "gate-score rows)")
    _refused(tmp_path, v41_text, line, line + line.replace("state_c2", "cmp_c4"), "cmp_c4:",
             "pools.groups.cmp_c4", "no layer of this model owns a cmp_c4 group; its groups "
             "are ori, cmp_c1, cmp_c2, idx_c1, idx_c2, state_c2")
    _refused(tmp_path, v41_text, "    cmp_c2:   {layers: [full]", "    cmp_c2:   {layers: [reuse]",
             "cmp_c2:", "pools.groups.cmp_c2.layers", "['reuse'] must be ['full'] for this model")
    _refused(tmp_path, v41_text, "row_width: 64, dtype: float32, policy: ring}",
             "row_width: 64, dtype: float32, policy: ring, format: fp4_16}", "    ori:",
             "pools.groups.ori.format", "ori rows may be stored as compute or fp8_32, not fp4_16")
    _refused(tmp_path, v41_text, "    cmp_c2:   {layers: [full], rows_per_page: 64",
             "    cmp_c2:   {layers: [full], rows_per_page: 32", "cmp_c2:",
             "pools.groups.cmp_c2.rows_per_page", "32 must be block_size/2 = 64")


def test_unknown_keys_name_the_v41_keys(tmp_path, v41_text):
    text = replace_once(v41_text, "engram_pad_token_id", "engram_pad_id")
    [error] = _errors(tmp_path, text)
    assert error.startswith(
        f"bad.yaml:{line_of(text, 'engram_pad_id')}: model.engram_pad_id: unknown key "
        "'engram_pad_id' (did you mean 'engram_pad_token_id'?); valid keys here: model_type, "
        "vocab_size, ")
    assert "kv_source_layer_ids" in error and "num_hash_layers" not in error
    group = "row_width: 32, dtype: float32, policy: full}\n    idx_c2"
    text = replace_once(v41_text, group, group.replace("full}", "full, formt: fp4_32}"))
    assert _errors(tmp_path, text) == [
        f"bad.yaml:{line_of(text, '    idx_c1:')}: pools.groups.idx_c1.formt: unknown key "
        "'formt'; valid keys here: layers, rows_per_page, row_width, dtype, policy, format"]


def test_v41_tiny_plan(plans):
    plan = plans["v41-tiny"]
    assert (plan.family, plan.launchable, plan.has_mtp, plan.mtp_slots) == (
        "deepseek_v41", True, True, False)
    assert (plan.drafts, plan.engram_prior, plan.default_k, plan.rehearsed) == (
        False, 3, 0, False)
    layers = {p.name: p.layers for p in plan.pools}
    assert layers == {"ori": tuple(range(13)), "cmp_c1": (6,), "cmp_c2": (2, 4),
                      "idx_c1": (6,), "idx_c2": (2, 4), "state_c2": (2, 4)}
    assert [(r.role, r.kv_source, r.index_source) for r in plan.layer_roles[7:10]] == [
        ("reuse", 6, 6), ("reindex", 6, 8), ("reuse", 6, 8)]
    # float32 rows: (2 x 256 + 2 x 128) / 2 for the ratio-2 sources, 256 + 128 for layer 6
    assert plan.full_bytes_per_token == 768
    assert _pool(plan, "state_c2").ring_pages == 2     # span 2 + in_flight 4 - 2, 2 a page


def test_v41_flash_holds_890_bytes_of_global_kv_per_token(plans):
    """The issue's figure: compressed KV fp4 (288 bytes a 512-wide entry) and index keys fp4
    (68 a 128-wide key) on the kv sources only, 2, 8, 14 at ratio 2 and 20 at ratio 1."""
    plan = plans["deepseek-v41-flash"]
    per_token = {p.name: p.block_bytes / plan.block_size for p in plan.pools
                 if p.policy == "full"}
    assert per_token == {"cmp_c1": 288, "cmp_c2": 3 * 288 / 2, "idx_c1": 68,
                         "idx_c2": 3 * 68 / 2}
    assert plan.full_bytes_per_token == 890
    assert plans["deepseek-v4-flash"].full_bytes_per_token == 3514.25
    ori = _pool(plan, "ori")
    assert (len(ori.layers), ori.entry_bytes, ori.ring_pages) == (43, 528, 3)
    assert _pool(plan, "cmp_c2").layers == (2, 8, 14) and _pool(plan, "cmp_c1").layers == (20,)
    roles = [r.role for r in plan.layer_roles]
    assert [i for i, r in enumerate(roles) if r == "reindex"] == [24, 28, 32, 36]
    assert (roles.count("reuse"), roles.count("window"), roles.count("dspark")) == (30, 2, 3)


def test_v41_packages_launch_the_prefill_and_k0_decode_on_torch(tmp_path):
    generate([SPECS / "v41-tiny.yaml", SPECS / "deepseek-v41-flash.yaml"], tmp_path / "out",
             root=REPO, every=False)
    package = import_fresh(tmp_path / "out", "v41_tiny")
    assert (package.FAMILY, package.REHEARSED) == ("deepseek_v41", False)
    kernels = package.kernels
    assert list(kernels.KERNELS) == ["prefill_main", "decode_b8s1"]
    assert list(kernels.DECODE_BY_K) == [0] and not hasattr(kernels, "DECODE_KEEPING_SLOTS_BY_K")
    names = [a.name for a in kernels.PREFILL_MAIN.args]
    assert names[:4] == ["token_ids", "engram_prior", "start_pos", "chunk_lens"]
    assert names[-1] == "logits" and "mtp_hidden" not in names
    prior = kernels.DECODE_B8S1.arg("engram_prior")
    assert (prior.role, prior.dtype, prior.shape, prior.staged) == (
        "input", "int64", ("ranks", 8, 3), True)
    assert package.architecture.KV_SOURCE_LAYERS == (2, 4, 6)
    assert package.architecture.LAYER_ROLES[8] == "reindex"
    assert package.pools.GROUPS["cmp_c2"].blocks_for(1000) == 8       # 500 entries, 64 a page
    assert not hasattr(package.pools, "MtpField")
    # the spec asks K = 1 by default (and the flash spec the compiled backend): the contract
    # serves what the kernels do, and says why
    tiny = (tmp_path / "out" / "v41_tiny" / "contract.py").read_text()
    assert "DEFAULT_NUM_SPECULATIVE_TOKENS 0, not the spec's 1: DeepSeek V4.1's drafter" in tiny
    assert package.contract.DEFAULT_NUM_SPECULATIVE_TOKENS == 0
    assert sorted(package.contract.DECODE_LAYOUTS) == [0, 1, 2, 3]    # the pools' sizes
    flash = import_fresh(tmp_path / "out", "deepseek_v41_flash")
    assert flash.contract.BACKEND == "torch" and flash.kernels.PREFILL_MAIN.backend == "torch"
    assert "BACKEND 'torch', not the spec's 'compiled': DeepSeek V4.1's kernels run on the" \
        in (tmp_path / "out" / "deepseek_v41_flash" / "contract.py").read_text()


def test_codegen_help_describes_the_v41_sections():
    from codegen.cli import spec_fields_help

    text = spec_fields_help()
    assert "\n  model (V4.1): " in text and "\n  pools (V4.1): " in text
    assert "kv_source_layer_ids" in text and "engram: fp8 | unquantized" in text
