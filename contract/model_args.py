"""Architecture facts of a model, derived once from its config (generated CONFIG).

Two families: DeepSeek V4 (layer kinds by compress ratio: sliding 0, CSA 4, HCA 128;
hash-routed first layers; an MTP block) and DeepSeek V4.1 (CSA2: every compressed layer
has a role, contract/layer_roles.py; Engram memory on a few layers; single-pass
hyper-connections; DSpark stages in place of MTP). The V4.1 fields default to values
that mean "V4", so a V4 config reads exactly as before.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from contract.layer_roles import latest, layer_role
from contract.v41_config import is_v41, text_config

KIND_OF_RATIO = {0: "sliding", 4: "csa", 128: "hca"}
V4, V41 = "deepseek_v4", "deepseek_v41"


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
    compress_ratios: tuple[int, ...]   # per layer id, MTP (DSpark) layers last
    window: int
    hc_mult: int
    hc_eps: float
    hc_sinkhorn_iters: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    n_mtp_layers: int                  # V4: MTP layers; V4.1: DSpark stages
    norm_eps: float
    # --- V4.1; the defaults are V4 ---
    family: str = V4
    hc_single_pass: bool = False       # a sub-layer's pre-mix collapses the next one's input
    kv_source_layers: tuple[int, ...] = ()      # own a compressor, compressed KV, index keys
    index_source_layers: tuple[int, ...] = ()   # run an indexer
    candidate_source_layer: int = -1            # publishes the candidate blocks; < 0: none
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    engram_layers: tuple[int, ...] = ()         # Engram added to the streams before the block
    engram_num_embeddings: tuple[int, ...] = ()  # table rows, one per Engram layer
    engram_max_ngram: int = 0                   # n-grams 2..engram_max_ngram
    engram_vocab_size: int = 0                  # the prime search starts above it - 1
    engram_heads: int = 0
    engram_head_dim: int = 0                    # width of one table row
    engram_pad_id: int = 0                      # raw token id of missing history
    engram_compressed_vocab: int = 0            # entries of the compressed token map
    dspark_block_size: int = 0                  # B: the anchor and B - 1 noise tokens
    dspark_noise_id: int = -1
    dspark_target_layers: tuple[int, ...] = ()  # backbone layers whose input streams feed it
    dspark_markov_rank: int = 0
    dspark_n_experts: int = 0                   # the stages' routed experts; 0: the backbone's
    dspark_n_active: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelArgs:
        """From a V4 config.json, or a V4.1 config in any of its spellings
        (contract/v41_config.py)."""
        if is_v41(config):
            return cls._from_v41(text_config(config))
        return cls._from_v4(config)

    @classmethod
    def _from_v4(cls, config: Mapping[str, Any]) -> ModelArgs:
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

    @classmethod
    def _from_v41(cls, c: Mapping[str, Any]) -> ModelArgs:
        """From the flat text_config spelling: V4's keys less num_hash_layers, plus the
        sources, Engram and DSpark keys."""
        v4 = cls._from_v4({**c, "num_hash_layers": 0,
                           "norm_topk_prob": c.get("norm_topk_prob", True)})
        return replace(
            v4, family=V41, hc_single_pass=True,
            kv_source_layers=tuple(c["kv_source_layer_ids"]),
            index_source_layers=tuple(c["index_source_layer_ids"]),
            candidate_source_layer=c["candidate_source_layer_id"],
            candidate_topk_blocks=c["candidate_topk_blocks"],
            candidate_block_size=c["candidate_block_size"],
            engram_layers=tuple(c["engram_layer_ids"]),
            engram_num_embeddings=tuple(c["engram_num_embeddings"]),
            engram_max_ngram=c["engram_max_ngram_size"],
            engram_vocab_size=c["engram_vocab_size"], engram_heads=c["engram_n_heads"],
            engram_head_dim=c["engram_head_dim"], engram_pad_id=c["engram_pad_token_id"],
            engram_compressed_vocab=c["engram_compressed_vocab_size"],
            dspark_block_size=c["dspark_block_size"],
            dspark_noise_id=c["dspark_noise_token_id"],
            dspark_target_layers=tuple(c["dspark_target_layer_ids"]),
            dspark_markov_rank=c["dspark_markov_rank"],
            dspark_n_experts=c["dspark_n_routed_experts"],
            dspark_n_active=c["dspark_num_experts_per_tok"])

    @property
    def is_v41(self) -> bool:
        return self.family == V41

    def kind(self, layer: int) -> str:
        """"sliding" | "csa" | "hca" of a V4 main layer; "sliding" | "csa2" of a V4.1 one;
        "mtp" of an MTP layer or DSpark stage. A V4.1 layer's `role` says more."""
        if layer >= self.n_layers:
            return "mtp"
        if self.is_v41:
            return "csa2" if self.compress_ratios[layer] else "sliding"
        return KIND_OF_RATIO[self.compress_ratios[layer]]

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def role(self, layer: int) -> str:
        """V4.1: "window" | "full" | "reindex" | "reuse" | "dspark" (contract/layer_roles.py)."""
        if not self.is_v41:
            raise ValueError(f"layer roles are V4.1's; a {self.family} layer has a kind "
                             f"({self.kind(layer)!r})")
        return layer_role(layer, self.n_layers, self.compress_ratios[layer],
                          self.kv_source_layers, self.index_source_layers)

    def compressor_overlap(self, layer: int) -> int:
        """Whole groups before the open one that a compressed layer's compressor pools
        again: 1 for V4's ratio-4 (CSA) compressors (two overlapped windows), 0 for V4's
        HCA and every V4.1 compressor (ratio 1 or 2, never overlapped)."""
        return int(not self.is_v41 and self.compress_ratios[layer] == 4)

    def kv_source(self, layer: int) -> int | None:
        """V4.1: the layer whose compressed KV (and index keys) a compressed backbone layer
        reads: the latest kv source at or below it. None for window-only layers."""
        if layer >= self.n_layers or not self.compress_ratios[layer]:
            return None
        return latest(self.kv_source_layers, layer)

    def index_source(self, layer: int) -> int | None:
        """V4.1: the layer whose top-k a compressed backbone layer attends with: the latest
        index source at or below it. None for window-only layers."""
        if layer >= self.n_layers or not self.compress_ratios[layer]:
            return None
        return latest(self.index_source_layers, layer)

    def candidate_restricted(self, layer: int) -> bool:
        """V4.1: an index source above the candidate source scores inside its blocks."""
        return 0 <= self.candidate_source_layer < layer and layer in self.index_source_layers

    def is_hash(self, layer: int) -> bool:
        return layer < self.n_hash_layers

    def experts(self, layer: int) -> int:
        """Routed experts of a layer (V4.1's DSpark stages may have their own count)."""
        if layer >= self.n_layers and self.dspark_n_experts:
            return self.dspark_n_experts
        return self.n_experts

    def active(self, layer: int) -> int:
        """Experts a token of `layer` is routed to."""
        if layer >= self.n_layers and self.dspark_n_active:
            return self.dspark_n_active
        return self.n_active

    def prefix(self, layer: int) -> str:
        """Checkpoint name prefix of a layer: "layers.N." or "mtp.K."."""
        if layer < self.n_layers:
            return f"layers.{layer}."
        return f"mtp.{layer - self.n_layers}."

    @property
    def mtp_layers(self) -> range:
        return range(self.n_layers, self.n_layers + self.n_mtp_layers)
