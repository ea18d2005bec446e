# @generated from specs/tiny-deep.yaml by codegen — do not edit
"""Model architecture of spec `tiny-deep`: config.json keys and layer layout."""
from __future__ import annotations

from types import MappingProxyType

# The spec's `model` section, keyed as the checkpoint's config.json.
CONFIG = MappingProxyType({
    "bos_token_id": 0,
    "compress_ratios": (0, 4, 128, 4, 4, 128, 4, 4, 128, 4, 4, 128, 4, 4, 128, 4, 0),
    "compress_rope_theta": 160000.0,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 128,
    "hidden_size": 256,
    "index_head_dim": 64,
    "index_n_heads": 8,
    "index_topk": 32,
    "max_position_embeddings": 1048576,
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hash_layers": 1,
    "num_hidden_layers": 16,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 2,
    "o_lora_rank": 64,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    "rope_theta": 10000.0,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 128,
    "swiglu_limit": 10.0,
    "topk_method": "noaux_tc",
    "vocab_size": 4096,
})

# sha256 of CONFIG; loaded weights must carry the same fingerprint to be launched.
FINGERPRINT = "6861b2643aabf1ef"

NUM_MAIN_LAYERS = 16

# Kind of every layer id: main layers first, then the MTP layer(s).
LAYER_KINDS = (
    "sliding",  # layer 0
    "csa",  # layer 1
    "hca",  # layer 2
    "csa",  # layer 3
    "csa",  # layer 4
    "hca",  # layer 5
    "csa",  # layer 6
    "csa",  # layer 7
    "hca",  # layer 8
    "csa",  # layer 9
    "csa",  # layer 10
    "hca",  # layer 11
    "csa",  # layer 12
    "csa",  # layer 13
    "hca",  # layer 14
    "csa",  # layer 15
    "mtp",  # layer 16
)
