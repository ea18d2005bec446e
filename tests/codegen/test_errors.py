"""Bad specs: each fails with one line naming file:line, the field, and what is valid."""
from __future__ import annotations

import pytest

from codegen.errors import SpecError
from codegen.pipeline import load_spec
from tests.conftest import line_of, replace_once


def _error(tmp_path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path, root=tmp_path)
    return str(info.value)


def _check(tmp_path, tiny_text, old, new, needle, field, message):
    text = replace_once(tiny_text, old, new)
    line = line_of(text, needle)
    assert _error(tmp_path, text) == f"bad.yaml:{line}: {field}: {message}"


MODEL_KEYS = (
    "vocab_size, hidden_size, moe_intermediate_size, num_hidden_layers, num_hash_layers, "
    "num_attention_heads, num_key_value_heads, head_dim, qk_rope_head_dim, q_lora_rank, "
    "o_lora_rank, o_groups, n_routed_experts, n_shared_experts, num_experts_per_tok, "
    "routed_scaling_factor, norm_topk_prob, scoring_func, topk_method, swiglu_limit, "
    "max_position_embeddings, rope_theta, compress_rope_theta, rope_scaling, compress_ratios, "
    "sliding_window, hc_eps, hc_mult, hc_sinkhorn_iters, index_head_dim, index_n_heads, "
    "index_topk, num_nextn_predict_layers, rms_norm_eps, bos_token_id, eos_token_id")


def test_unknown_key_names_the_key_and_the_valid_ones(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  hidden_size: 256", "  hiden_size: 256", "hiden_size",
           "model.hiden_size",
           "unknown key 'hiden_size' (did you mean 'hidden_size'?); valid keys here: "
           + MODEL_KEYS)


def test_unknown_pool_group_lists_the_seven(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "    idx:  ", "    indexer:  ", "    indexer:  ",
           "pools.groups.indexer", "unknown key 'indexer' (did you mean 'idx'?); valid keys "
           "here: ori, cmp_c128, cmp_c4, idx, hca_state, csa_state, csa_inner_state")


def test_unknown_key_without_a_lookalike_leaves_the_missing_one_reported(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  mtp_window: 128", "  speculative_window: 128")
    assert _error(tmp_path, text).splitlines() == [
        f"bad.yaml:{line_of(text, 'prefill:')}: prefill.mtp_window: missing required key",
        f"bad.yaml:{line_of(text, 'speculative_window')}: prefill.speculative_window: unknown "
        "key 'speculative_window'; valid keys here: tile, max_extent, slots_per_rank, mtp_window",
    ]


def test_duplicate_key(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  tile: 128\n", "  tile: 128\n  tile: 256\n")
    first, second = line_of(text, "tile: 128"), line_of(text, "tile: 256")
    assert _error(tmp_path, text) == (
        f"bad.yaml:{second}: prefill.tile: duplicate key (first written on line {first})")


def test_wrong_type_is_not_coerced(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  tile: 128", '  tile: "128"', "tile:", "prefill.tile",
           "Input should be a valid integer, got '128'")


def test_invalid_choice(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  device: cpu", "  device: tpu", "device:", "topology.device",
           "Input should be 'cpu', 'cuda' or 'npu', got 'tpu'")


def test_missing_key_points_at_its_section(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  mtp_window: 128\n", "", "prefill:", "prefill.mtp_window",
           "missing required key")


def test_tile_must_divide_the_extent(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  max_extent: 8192", "  max_extent: 8000", "  tile:",
           "prefill.tile", "128 does not divide max_extent 8000")


def test_advertised_k_needs_a_layout(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "num_speculative_tokens: [0, 1, 2, 3]",
           "num_speculative_tokens: [0, 1, 2, 3, 4]", "  num_speculative_tokens:",
           "decode.num_speculative_tokens[4]",
           "K=4 has no decode layout; add one with k: 4, seq: 5")


def test_layout_seq_must_be_k_plus_one(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "{k: 1, batch: 4, seq: 2}", "{k: 1, batch: 4, seq: 3}",
           "{k: 1, batch: 4, seq: 3}", "decode.layouts[1].seq", "must be k + 1 = 2 for k=1, not 3")


def test_pool_row_width_must_match_the_model(tmp_path, tiny_text):
    old = "rows_per_page: 128, row_width: 128"
    _check(tmp_path, tiny_text, old, "rows_per_page: 128, row_width: 256", "    ori:",
           "pools.groups.ori.row_width", "256 must be head_dim = 128")


def test_pool_layers_must_match_the_model(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "cmp_c4:          {layers: [csa]",
           "cmp_c4:          {layers: [hca]", "    cmp_c4:", "pools.groups.cmp_c4.layers",
           "['hca'] must be ['csa'] for this model")


def test_full_pool_rows_follow_the_block_size(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "idx:             {layers: [csa], rows_per_page: 32",
           "idx:             {layers: [csa], rows_per_page: 16", "    idx:",
           "pools.groups.idx.rows_per_page", "16 must be block_size/4 = 32")


def test_compressor_state_must_be_float32(tmp_path, tiny_text):
    old = "row_width: 256, dtype: float32, policy: ring}\n    csa_state"
    _check(tmp_path, tiny_text, old, old.replace("float32", "bfloat16"), "    hca_state:",
           "pools.groups.hca_state.dtype", "compressor state is kept in float32, not bfloat16")


def test_compress_ratios_need_one_entry_per_layer_and_mtp(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "compress_ratios: [0, 4, 128, 4, 0]",
           "compress_ratios: [0, 4, 128, 4]", "compress_ratios:", "model.compress_ratios",
           "has 4 entries; need num_hidden_layers + num_nextn_predict_layers = 4 + 1 = 5")


def test_expert_parallelism_shares_the_ranks(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  ep: 8 ", "  ep: 4 ", "  ep: 4", "topology.ep",
           "expert parallelism runs on the same ranks as attention: ep must equal ranks 8, not 4")


def test_weights_are_held_as_released_or_in_the_compute_dtype(tmp_path, tiny_text):
    _check(tmp_path, tiny_text, "  format: as_released", "  format: bfloat16", "  format:",
           "weights.format", "'bfloat16': the weights are held as released or dequantized "
           "to the compute dtype ('float32')")


def test_fp4_experts_need_inputs_in_groups_of_32(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  experts: unquantized", "  experts: fp4")
    text = replace_once(text, "hidden_size: 256", "hidden_size: 240")
    assert "weights.experts: fp4 experts take a scale per 32 inputs: model.hidden_size 240" \
        in _error(tmp_path, text)


def test_max_num_seqs_must_fit_the_decode_capacity(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  max_num_seqs: 64", "  max_num_seqs: 65")
    line = text.splitlines().index("  max_num_seqs: 65") + 1
    assert _error(tmp_path, text) == "\n".join(
        f"bad.yaml:{line}: limits.max_num_seqs: 65 exceeds the K={k} decode capacity "
        "ranks*batch*micro_batches = 8*4*2 = 64" for k in (1, 2, 3))


def test_invalid_yaml_names_the_line(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  tile: 128", "  tile: [128")
    message = _error(tmp_path, text)
    assert message.startswith("bad.yaml:") and "invalid YAML" in message


def test_every_error_is_reported_one_per_line_in_line_order(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  hidden_size: 256", "  hiden_size: 256")
    text = replace_once(text, "  tile: 128", "  tile: -1")
    lines = _error(tmp_path, text).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["model.hiden_size", "prefill.tile"]
    assert lines == sorted(lines, key=lambda line: int(line.split(":")[1]))


BUCKETS = "  context_buckets: [1024, 4096, 16384]"


@pytest.mark.parametrize(("buckets", "field", "message"), [
    ("[1024, 1024, 16384]", "decode.context_buckets[1]",
     "1024 must exceed the bucket before it (1024)"),
    ("[1000, 4096, 16384]", "decode.context_buckets[0]",
     "1000 must be a multiple of pools.block_size 128"),
    ("[1024, 4096, 8192]", "decode.context_buckets[2]",
     "the last bucket must be limits.max_model_len 16384, not 8192"),
    ("[]", "decode.context_buckets", "List should have at least 1 item after validation, not 0"),
])
def test_context_buckets_ascend_to_max_model_len(tmp_path, tiny_text, buckets, field, message):
    _check(tmp_path, tiny_text, BUCKETS, f"  context_buckets: {buckets}", "context_buckets",
           field, message)


def test_a_context_bucket_holds_index_topk_csa_entries(tmp_path, tiny_text):
    text = replace_once(tiny_text, "  index_topk: 32", "  index_topk: 512")
    assert "decode.context_buckets[0]: 1024 holds 256 CSA entries, fewer than index_topk " \
        "512; the smallest bucket is 2048" in _error(tmp_path, text)


def test_a_bucket_splits_its_csa_entries_into_the_indexer_tiles():
    """Where block_size allows it (a model without HCA layers may take any multiple of 4),
    a bucket whose CSA entries the decode indexer cannot cut into equal tiles is refused."""
    from codegen.invariants import check_invariants
    from tests.conftest import REPO

    spec = load_spec(REPO / "specs" / "tiny.yaml")
    spec = spec.model_copy(update={
        "pools": spec.pools.model_copy(update={"block_size": 16}),
        "decode": spec.decode.model_copy(update={"context_buckets": [1040, 4096, 16384]})})
    assert (("decode", "context_buckets", 0),
            "1040 holds 260 CSA entries, which the decode indexer scores in 8 equal tiles: "
            "it must be a multiple of 32") in list(check_invariants(spec))


def test_entry_formats_fit_their_group(tmp_path, tiny_text):
    state = "row_width: 256, dtype: float32, policy: ring}\n    csa_state"
    _check(tmp_path, tiny_text, state, state.replace("ring}", "ring, format: fp8}"),
           "    hca_state:", "pools.groups.hca_state.format",
           "hca_state rows may be stored as compute, not fp8")
    keys = "row_width: 64, dtype: float32, policy: full}"
    _check(tmp_path, tiny_text, keys, keys.replace("full}", "full, format: fp8_ds}"),
           "    idx:", "pools.groups.idx.format",
           "idx rows may be stored as compute or fp8 or fp4, not fp8_ds")
