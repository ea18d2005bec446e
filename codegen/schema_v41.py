"""Pydantic models of a DeepSeek V4.1 spec: the model section keyed as the release's
text_config, the pool groups CSA2 needs, and the Engram tables' weights format.

The other sections (topology, prefill, decode, limits) are V4's. Checks that span
fields live in `invariants_v41.py`; a spec is V4.1 when its model section says
`model_type: deepseek_v41_text` (codegen/family.py).
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from codegen.schema import (
    DecodeSection,
    DType,
    LimitsSection,
    PrefillSection,
    TopologySection,
    WeightsSection,
    _Strict,
)

LayerRole = Literal["window", "full", "reindex", "reuse", "dspark"]
LayerId = Annotated[int, Field(ge=0)]


class RopeScalingV41(_Strict):
    """YaRN scaling of the compressed layers, spelt as the release's text_config."""

    rope_type: Literal["yarn"]
    factor: PositiveFloat
    beta_fast: PositiveFloat
    beta_slow: PositiveFloat
    original_max_position_embeddings: PositiveInt


class ModelSectionV41(_Strict):
    """The architecture, with the key names of the release's text_config (config.json),
    bos/eos from its top level. compress_ratios has one entry per layer, then one (0) per
    DSpark stage: 0 window only, r > 0 a CSA2 layer whose role the source lists give."""

    FAMILY: ClassVar[str] = "deepseek_v41"

    model_type: Literal["deepseek_v41_text"]
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    moe_intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    num_key_value_heads: Literal[1]
    q_lora_rank: PositiveInt
    o_lora_rank: PositiveInt
    o_groups: PositiveInt
    swiglu_limit: PositiveFloat
    rms_norm_eps: PositiveFloat
    n_routed_experts: PositiveInt
    n_shared_experts: int = Field(ge=0)
    num_experts_per_tok: PositiveInt
    scoring_func: Literal["sqrtsoftplus"]
    routed_scaling_factor: PositiveFloat
    sliding_window: PositiveInt
    compress_ratios: list[LayerId]
    compress_rope_theta: PositiveFloat
    kv_source_layer_ids: list[LayerId]
    index_source_layer_ids: list[LayerId]
    index_n_heads: PositiveInt
    index_head_dim: PositiveInt
    index_topk: PositiveInt
    candidate_source_layer_id: int          # < 0: no candidate blocks
    candidate_topk_blocks: int = Field(ge=0)
    candidate_block_size: PositiveInt
    hc_mult: PositiveInt
    hc_sinkhorn_iters: PositiveInt
    hc_eps: PositiveFloat
    engram_layer_ids: list[LayerId]
    engram_num_embeddings: list[PositiveInt]
    engram_max_ngram_size: int = Field(ge=2)
    engram_vocab_size: PositiveInt
    engram_n_heads: PositiveInt
    engram_head_dim: PositiveInt
    engram_pad_token_id: int = Field(ge=0)
    engram_compressed_vocab_size: PositiveInt
    num_nextn_predict_layers: int = Field(ge=0)
    dspark_block_size: PositiveInt
    dspark_noise_token_id: int = Field(ge=0)
    dspark_target_layer_ids: list[LayerId]
    dspark_markov_rank: PositiveInt
    dspark_n_routed_experts: int = Field(ge=0)      # 0: the backbone's
    dspark_num_experts_per_tok: int = Field(ge=0)   # 0: the backbone's
    max_position_embeddings: PositiveInt
    rope_theta: PositiveFloat
    topk_method: Literal["noaux_tc"]
    norm_topk_prob: Literal[True]
    rope_scaling: RopeScalingV41
    bos_token_id: int = Field(ge=0)
    eos_token_id: int = Field(ge=0)


class WeightsSectionV41(WeightsSection):
    """V4's weights section, plus how the release stores the Engram tables: FP8 e4m3
    with an e8m0 scale per 32 values of a row (as released), or unquantized. The dense
    FP8 scales cover 32 x 32 blocks (V4: 128 x 128)."""

    engram: Literal["fp8", "unquantized"] = "unquantized"


class PoolGroupV41(_Strict):
    """One grouped KV/state pool: a page per scheduler block in every layer of the
    roles listed (for a source group, the kv sources of its ratio)."""

    layers: list[LayerRole] = Field(min_length=1)
    rows_per_page: PositiveInt
    row_width: PositiveInt
    dtype: DType
    policy: Literal["ring", "full"]
    format: Literal["compute", "fp8_32", "fp4_16", "fp4_32"] = "compute"   # entry format


class PoolsSectionV41(_Strict):
    """block_size and the groups CSA2 needs, by name (codegen/pool_roles.py): ori for
    every layer's window; cmp_c{r} and idx_c{r} for the kv sources of ratio r; state_c{r}
    for their open compressor group where r > 1."""

    block_size: PositiveInt
    groups: dict[str, PoolGroupV41]

    def group(self, name: str) -> PoolGroupV41 | None:
        return self.groups.get(name)


class SpecV41(_Strict):
    """A whole DeepSeek V4.1 deployment spec (one YAML file)."""

    model: ModelSectionV41
    topology: TopologySection
    weights: WeightsSectionV41 = WeightsSectionV41()
    prefill: PrefillSection
    decode: DecodeSection
    pools: PoolsSectionV41
    limits: LimitsSection
