# @generated from specs/v41-tiny.yaml by codegen — do not edit
"""Model architecture of spec `v41-tiny`: config.json keys and layer layout."""
from __future__ import annotations

from types import MappingProxyType

# The spec's `model` section, keyed as the checkpoint's config.json.
CONFIG = MappingProxyType({
    "bos_token_id": 0,
    "candidate_block_size": 8,
    "candidate_source_layer_id": 6,
    "candidate_topk_blocks": 4,
    "compress_ratios": (0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0),
    "compress_rope_theta": 160000.0,
    "dspark_block_size": 5,
    "dspark_markov_rank": 16,
    "dspark_n_routed_experts": 4,
    "dspark_noise_token_id": 510,
    "dspark_num_experts_per_tok": 2,
    "dspark_target_layer_ids": (7, 8, 9),
    "engram_compressed_vocab_size": 464,
    "engram_head_dim": 32,
    "engram_layer_ids": (1, 4),
    "engram_max_ngram_size": 4,
    "engram_n_heads": 4,
    "engram_num_embeddings": (1040, 1786),
    "engram_pad_token_id": 2,
    "engram_vocab_size": 61,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 64,
    "hidden_size": 128,
    "index_head_dim": 32,
    "index_n_heads": 16,
    "index_source_layer_ids": (2, 4, 6, 8),
    "index_topk": 16,
    "kv_source_layer_ids": (2, 4, 6),
    "max_position_embeddings": 1048576,
    "model_type": "deepseek_v41_text",
    "moe_intermediate_size": 64,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 10,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 3,
    "o_groups": 2,
    "o_lora_rank": 32,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 16,
    "rms_norm_eps": 1e-20,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 16.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 65536,
    },
    "rope_theta": 10000.0,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 128,
    "swiglu_limit": 2.0,
    "topk_method": "noaux_tc",
    "vocab_size": 512,
})

# sha256 of CONFIG; loaded weights must carry the same fingerprint to be launched.
FINGERPRINT = "33d60be7d0e0700a"

NUM_MAIN_LAYERS = 10

# Kind of every layer id: main layers first, then the MTP layer(s).
LAYER_KINDS = (
    "sliding",  # layer 0
    "sliding",  # layer 1
    "csa2",  # layer 2
    "csa2",  # layer 3
    "csa2",  # layer 4
    "csa2",  # layer 5
    "csa2",  # layer 6
    "csa2",  # layer 7
    "csa2",  # layer 8
    "csa2",  # layer 9
    "mtp",  # layer 10
    "mtp",  # layer 11
    "mtp",  # layer 12
)

# Role of every layer id (contract/layer_roles.py) and the sources it reads: the kv source
# whose compressed KV and index keys it attends, the index source whose top-k it uses.
LAYER_ROLES = (
    "window",  # layer 0
    "window",  # layer 1
    "full",  # layer 2: ratio 2, kv source 2, index source 2
    "reuse",  # layer 3: ratio 2, kv source 2, index source 2
    "full",  # layer 4: ratio 2, kv source 4, index source 4
    "reuse",  # layer 5: ratio 2, kv source 4, index source 4
    "full",  # layer 6: ratio 1, kv source 6, index source 6
    "reuse",  # layer 7: ratio 1, kv source 6, index source 6
    "reindex",  # layer 8: ratio 1, kv source 6, index source 8
    "reuse",  # layer 9: ratio 1, kv source 6, index source 8
    "dspark",  # layer 10
    "dspark",  # layer 11
    "dspark",  # layer 12
)
KV_SOURCE_LAYERS = (2, 4, 6)
