"""Architecture facts of a model, derived once from its config (generated CONFIG)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KIND_OF_RATIO = {0: "sliding", 4: "csa", 128: "hca"}


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_hash_layers: int
    n_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    n_experts: int
    n_shared_experts: int
    n_active: int
    moe_inter: int
    route_scale: float
    norm_topk_prob: bool
    swiglu_limit: float
    rope_theta: float
    compress_rope_theta: float
    yarn_factor: float
    yarn_original_max: int
    yarn_beta_fast: float
    yarn_beta_slow: float
    compress_ratios: tuple[int, ...]   # per layer id, MTP layers last
    window: int
    hc_mult: int
    hc_eps: float
    hc_sinkhorn_iters: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    n_mtp_layers: int
    norm_eps: float

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelArgs:
        rope = config["rope_scaling"]
        return cls(
            vocab_size=config["vocab_size"], dim=config["hidden_size"],
            n_layers=config["num_hidden_layers"], n_hash_layers=config["num_hash_layers"],
            n_heads=config["num_attention_heads"], head_dim=config["head_dim"],
            rope_dim=config["qk_rope_head_dim"], q_lora_rank=config["q_lora_rank"],
            o_lora_rank=config["o_lora_rank"], o_groups=config["o_groups"],
            n_experts=config["n_routed_experts"], n_shared_experts=config["n_shared_experts"],
            n_active=config["num_experts_per_tok"], moe_inter=config["moe_intermediate_size"],
            route_scale=config["routed_scaling_factor"], norm_topk_prob=config["norm_topk_prob"],
            swiglu_limit=config["swiglu_limit"], rope_theta=config["rope_theta"],
            compress_rope_theta=config["compress_rope_theta"], yarn_factor=rope["factor"],
            yarn_original_max=rope["original_max_position_embeddings"],
            yarn_beta_fast=rope["beta_fast"], yarn_beta_slow=rope["beta_slow"],
            compress_ratios=tuple(config["compress_ratios"]), window=config["sliding_window"],
            hc_mult=config["hc_mult"], hc_eps=config["hc_eps"],
            hc_sinkhorn_iters=config["hc_sinkhorn_iters"], index_heads=config["index_n_heads"],
            index_head_dim=config["index_head_dim"], index_topk=config["index_topk"],
            n_mtp_layers=config["num_nextn_predict_layers"], norm_eps=config["rms_norm_eps"],
        )

    def kind(self, layer: int) -> str:
        """"sliding" | "csa" | "hca" of a main layer; "mtp" of an MTP layer."""
        return "mtp" if layer >= self.n_layers else KIND_OF_RATIO[self.compress_ratios[layer]]

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def is_hash(self, layer: int) -> bool:
        return layer < self.n_hash_layers

    def prefix(self, layer: int) -> str:
        """Checkpoint name prefix of a layer: "layers.N." or "mtp.K."."""
        if layer < self.n_layers:
            return f"layers.{layer}."
        return f"mtp.{layer - self.n_layers}."

    @property
    def mtp_layers(self) -> range:
        return range(self.n_layers, self.n_layers + self.n_mtp_layers)
