# @generated from specs/deepseek-v41-flash.yaml by codegen — do not edit
"""Model architecture of spec `deepseek-v41-flash`: config.json keys and layer layout."""
from __future__ import annotations

from types import MappingProxyType

# The spec's `model` section, keyed as the checkpoint's config.json.
CONFIG = MappingProxyType({
    "bos_token_id": 0,
    "candidate_block_size": 8,
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "compress_ratios": (
        0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0,
    ),
    "compress_rope_theta": 160000.0,
    "dspark_block_size": 5,
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_noise_token_id": 128799,
    "dspark_num_experts_per_tok": 3,
    "dspark_target_layer_ids": (37, 38, 39),
    "engram_compressed_vocab_size": 99092,
    "engram_head_dim": 256,
    "engram_layer_ids": (1, 14),
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_num_embeddings": (384006168, 384016682),
    "engram_pad_token_id": 2,
    "engram_vocab_size": 16000000,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 512,
    "hidden_size": 5120,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_source_layer_ids": (2, 8, 14, 20, 24, 28, 32, 36),
    "index_topk": 512,
    "kv_source_layer_ids": (2, 8, 14, 20),
    "max_position_embeddings": 1048576,
    "model_type": "deepseek_v41_text",
    "moe_intermediate_size": 2304,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 40,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 3,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "q_lora_rank": 1280,
    "qk_rope_head_dim": 64,
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
    "swiglu_limit": 10.0,
    "topk_method": "noaux_tc",
    "vocab_size": 129280,
})

# sha256 of CONFIG; loaded weights must carry the same fingerprint to be launched.
FINGERPRINT = "0f2c66736f4afc8f"

NUM_MAIN_LAYERS = 40

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
    "csa2",  # layer 10
    "csa2",  # layer 11
    "csa2",  # layer 12
    "csa2",  # layer 13
    "csa2",  # layer 14
    "csa2",  # layer 15
    "csa2",  # layer 16
    "csa2",  # layer 17
    "csa2",  # layer 18
    "csa2",  # layer 19
    "csa2",  # layer 20
    "csa2",  # layer 21
    "csa2",  # layer 22
    "csa2",  # layer 23
    "csa2",  # layer 24
    "csa2",  # layer 25
    "csa2",  # layer 26
    "csa2",  # layer 27
    "csa2",  # layer 28
    "csa2",  # layer 29
    "csa2",  # layer 30
    "csa2",  # layer 31
    "csa2",  # layer 32
    "csa2",  # layer 33
    "csa2",  # layer 34
    "csa2",  # layer 35
    "csa2",  # layer 36
    "csa2",  # layer 37
    "csa2",  # layer 38
    "csa2",  # layer 39
    "mtp",  # layer 40
    "mtp",  # layer 41
    "mtp",  # layer 42
)

# Role of every layer id (contract/layer_roles.py) and the sources it reads: the kv source
# whose compressed KV and index keys it attends, the index source whose top-k it uses.
LAYER_ROLES = (
    "window",  # layer 0
    "window",  # layer 1
    "full",  # layer 2: ratio 2, kv source 2, index source 2
    "reuse",  # layer 3: ratio 2, kv source 2, index source 2
    "reuse",  # layer 4: ratio 2, kv source 2, index source 2
    "reuse",  # layer 5: ratio 2, kv source 2, index source 2
    "reuse",  # layer 6: ratio 2, kv source 2, index source 2
    "reuse",  # layer 7: ratio 2, kv source 2, index source 2
    "full",  # layer 8: ratio 2, kv source 8, index source 8
    "reuse",  # layer 9: ratio 2, kv source 8, index source 8
    "reuse",  # layer 10: ratio 2, kv source 8, index source 8
    "reuse",  # layer 11: ratio 2, kv source 8, index source 8
    "reuse",  # layer 12: ratio 2, kv source 8, index source 8
    "reuse",  # layer 13: ratio 2, kv source 8, index source 8
    "full",  # layer 14: ratio 2, kv source 14, index source 14
    "reuse",  # layer 15: ratio 2, kv source 14, index source 14
    "reuse",  # layer 16: ratio 2, kv source 14, index source 14
    "reuse",  # layer 17: ratio 2, kv source 14, index source 14
    "reuse",  # layer 18: ratio 2, kv source 14, index source 14
    "reuse",  # layer 19: ratio 2, kv source 14, index source 14
    "full",  # layer 20: ratio 1, kv source 20, index source 20
    "reuse",  # layer 21: ratio 1, kv source 20, index source 20
    "reuse",  # layer 22: ratio 1, kv source 20, index source 20
    "reuse",  # layer 23: ratio 1, kv source 20, index source 20
    "reindex",  # layer 24: ratio 1, kv source 20, index source 24
    "reuse",  # layer 25: ratio 1, kv source 20, index source 24
    "reuse",  # layer 26: ratio 1, kv source 20, index source 24
    "reuse",  # layer 27: ratio 1, kv source 20, index source 24
    "reindex",  # layer 28: ratio 1, kv source 20, index source 28
    "reuse",  # layer 29: ratio 1, kv source 20, index source 28
    "reuse",  # layer 30: ratio 1, kv source 20, index source 28
    "reuse",  # layer 31: ratio 1, kv source 20, index source 28
    "reindex",  # layer 32: ratio 1, kv source 20, index source 32
    "reuse",  # layer 33: ratio 1, kv source 20, index source 32
    "reuse",  # layer 34: ratio 1, kv source 20, index source 32
    "reuse",  # layer 35: ratio 1, kv source 20, index source 32
    "reindex",  # layer 36: ratio 1, kv source 20, index source 36
    "reuse",  # layer 37: ratio 1, kv source 20, index source 36
    "reuse",  # layer 38: ratio 1, kv source 20, index source 36
    "reuse",  # layer 39: ratio 1, kv source 20, index source 36
    "dspark",  # layer 40
    "dspark",  # layer 41
    "dspark",  # layer 42
)
KV_SOURCE_LAYERS = (2, 8, 14, 20)
