"""A DeepSeek V4.1 config in the three spellings a checkpoint comes with, read as one.

    release     config.json: HF keys, the text model under `text_config`
                (model_type deepseek_v41_text), bos/eos at the top level
    text        that text_config alone, flat: the spelling of a spec's model section
    inference   inference/config.json: the official ModelArgs keys (dim, n_layers,
                kv_source_layers, ...); no bos/eos, and the fields ModelArgs fixes
                (one KV head, normalized top-k weights) absent

`text_config` turns any of them into the flat text spelling. Torch-free.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODEL_TYPE = "deepseek_v41_text"
RELEASE_MODEL_TYPE = "deepseek_v41"

# inference/config.json key -> its text_config key; keys spelt alike in both are listed too
INFERENCE_KEYS = {
    "vocab_size": "vocab_size", "dim": "hidden_size", "moe_inter_dim": "moe_intermediate_size",
    "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "head_dim": "head_dim", "rope_head_dim": "qk_rope_head_dim",
    "q_lora_rank": "q_lora_rank", "o_lora_rank": "o_lora_rank", "o_groups": "o_groups",
    "swiglu_limit": "swiglu_limit", "norm_eps": "rms_norm_eps",
    "n_routed_experts": "n_routed_experts", "n_shared_experts": "n_shared_experts",
    "n_activated_experts": "num_experts_per_tok", "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor", "window_size": "sliding_window",
    "compress_ratios": "compress_ratios", "compress_rope_theta": "compress_rope_theta",
    "rope_theta": "rope_theta",
    "kv_source_layers": "kv_source_layer_ids", "index_source_layers": "index_source_layer_ids",
    "index_n_heads": "index_n_heads", "index_head_dim": "index_head_dim",
    "index_topk": "index_topk", "candidate_source_layer": "candidate_source_layer_id",
    "candidate_topk_blocks": "candidate_topk_blocks",
    "candidate_block_size": "candidate_block_size",
    "hc_mult": "hc_mult", "hc_sinkhorn_iters": "hc_sinkhorn_iters", "hc_eps": "hc_eps",
    "engram_layer_ids": "engram_layer_ids", "engram_num_embeddings": "engram_num_embeddings",
    "engram_max_ngram_size": "engram_max_ngram_size", "engram_vocab_size": "engram_vocab_size",
    "engram_n_heads": "engram_n_heads", "engram_head_dim": "engram_head_dim",
    "engram_pad_id": "engram_pad_token_id",
    "engram_compressed_vocab_size": "engram_compressed_vocab_size",
    "n_mtp_layers": "num_nextn_predict_layers", "dspark_block_size": "dspark_block_size",
    "dspark_noise_token_id": "dspark_noise_token_id",
    "dspark_target_layer_ids": "dspark_target_layer_ids",
    "dspark_markov_rank": "dspark_markov_rank",
    "dspark_n_routed_experts": "dspark_n_routed_experts",
    "dspark_n_activated_experts": "dspark_num_experts_per_tok",
}

# inference/config.json's YaRN keys -> rope_scaling's
INFERENCE_ROPE_KEYS = {"rope_factor": "factor", "beta_fast": "beta_fast",
                       "beta_slow": "beta_slow",
                       "original_seq_len": "original_max_position_embeddings"}

# What ModelArgs fixes and the text_config states (the official ModelArgs has gate_temp 1
# and normalizes the top-k weights; attention has one shared KV head).
INFERENCE_FIXED = {"model_type": MODEL_TYPE, "num_key_value_heads": 1, "norm_topk_prob": True,
                   "topk_method": "noaux_tc"}


def is_v41(config: Mapping[str, Any]) -> bool:
    """A V4.1 config in any spelling (V4's carries none of these marks)."""
    return ("text_config" in config
            or str(config.get("model_type", "")).startswith(RELEASE_MODEL_TYPE)
            or "kv_source_layers" in config or "kv_source_layer_ids" in config)


def is_inference_spelling(config: Mapping[str, Any]) -> bool:
    return "dim" in config and "n_layers" in config


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flat text_config spelling of a V4.1 config given in any of the three."""
    if "text_config" in config:
        text = dict(config["text_config"])
        for key in ("bos_token_id", "eos_token_id"):   # the release keeps them at the top
            if key in config and key not in text:
                text[key] = config[key]
        return text
    if is_inference_spelling(config):
        return _from_inference(config)
    return dict(config)


def _from_inference(config: Mapping[str, Any]) -> dict[str, Any]:
    """The inference spelling translated; max_position_embeddings is the YaRN-extended
    length, original_seq_len x rope_factor (1,048,576 as the release's text_config says)."""
    missing = [k for k in (*INFERENCE_KEYS, *INFERENCE_ROPE_KEYS) if k not in config]
    if missing:
        raise ValueError(f"inference config lacks {', '.join(missing)}")
    text: dict[str, Any] = dict(INFERENCE_FIXED)
    text.update({hf: config[key] for key, hf in INFERENCE_KEYS.items()})
    text["rope_scaling"] = {"rope_type": "yarn", **{hf: config[key] for key, hf
                                                    in INFERENCE_ROPE_KEYS.items()}}
    text["max_position_embeddings"] = int(config["original_seq_len"] * config["rope_factor"])
    return text
