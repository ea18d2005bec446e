# @generated from specs/deepseek-v4-flash.yaml by codegen — do not edit
"""Model architecture of spec `deepseek-v4-flash`: config.json keys and layer layout."""
from __future__ import annotations

from types import MappingProxyType

# The spec's `model` section, keyed as the checkpoint's config.json.
CONFIG = MappingProxyType({
    "bos_token_id": 0,
    "compress_ratios": (
        0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
        128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0,
    ),
    "compress_rope_theta": 160000.0,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 512,
    "hidden_size": 4096,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_topk": 512,
    "max_position_embeddings": 1048576,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 6,
    "num_hash_layers": 3,
    "num_hidden_layers": 43,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "q_lora_rank": 1024,
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
    "vocab_size": 129280,
})

# sha256 of CONFIG; loaded weights must carry the same fingerprint to be launched.
FINGERPRINT = "d2fe314f8fec0ddd"

NUM_MAIN_LAYERS = 43

# Kind of every layer id: main layers first, then the MTP layer(s).
LAYER_KINDS = (
    "sliding",  # layer 0
    "sliding",  # layer 1
    "csa",  # layer 2
    "hca",  # layer 3
    "csa",  # layer 4
    "hca",  # layer 5
    "csa",  # layer 6
    "hca",  # layer 7
    "csa",  # layer 8
    "hca",  # layer 9
    "csa",  # layer 10
    "hca",  # layer 11
    "csa",  # layer 12
    "hca",  # layer 13
    "csa",  # layer 14
    "hca",  # layer 15
    "csa",  # layer 16
    "hca",  # layer 17
    "csa",  # layer 18
    "hca",  # layer 19
    "csa",  # layer 20
    "hca",  # layer 21
    "csa",  # layer 22
    "hca",  # layer 23
    "csa",  # layer 24
    "hca",  # layer 25
    "csa",  # layer 26
    "hca",  # layer 27
    "csa",  # layer 28
    "hca",  # layer 29
    "csa",  # layer 30
    "hca",  # layer 31
    "csa",  # layer 32
    "hca",  # layer 33
    "csa",  # layer 34
    "hca",  # layer 35
    "csa",  # layer 36
    "hca",  # layer 37
    "csa",  # layer 38
    "hca",  # layer 39
    "csa",  # layer 40
    "hca",  # layer 41
    "csa",  # layer 42
    "mtp",  # layer 43
)
