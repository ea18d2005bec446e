"""Pydantic models of a deployment spec: shape and type of every field.

Checks that span fields live in `invariants.py`; this module only says what each field
is. Every model forbids unknown keys and coerces nothing (strict mode), so a typo or a
quoted number is an error that names the field.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

LayerKind = Literal["sliding", "csa", "hca", "mtp"]
DType = Literal["float32", "bfloat16", "float16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RopeScaling(_Strict):
    """YaRN scaling used by the compressed (CSA/HCA) layers."""

    type: Literal["yarn"]
    factor: PositiveFloat
    original_max_position_embeddings: PositiveInt
    beta_fast: PositiveFloat
    beta_slow: PositiveFloat


class ModelSection(_Strict):
    """The architecture, with the key names of the checkpoint's config.json."""

    FAMILY: ClassVar[str] = "deepseek_v4"

    vocab_size: PositiveInt
    hidden_size: PositiveInt
    moe_intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_hash_layers: int = Field(ge=0)
    num_attention_heads: PositiveInt
    num_key_value_heads: Literal[1]
    head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    q_lora_rank: PositiveInt
    o_lora_rank: PositiveInt
    o_groups: PositiveInt
    n_routed_experts: PositiveInt
    n_shared_experts: int = Field(ge=0)
    num_experts_per_tok: PositiveInt
    routed_scaling_factor: PositiveFloat
    norm_topk_prob: bool
    scoring_func: Literal["sqrtsoftplus"]
    topk_method: Literal["noaux_tc"]
    swiglu_limit: PositiveFloat
    max_position_embeddings: PositiveInt
    rope_theta: PositiveFloat
    compress_rope_theta: PositiveFloat
    rope_scaling: RopeScaling
    compress_ratios: list[Literal[0, 4, 128]]
    sliding_window: PositiveInt
    hc_eps: PositiveFloat
    hc_mult: PositiveInt
    hc_sinkhorn_iters: PositiveInt
    index_head_dim: PositiveInt
    index_n_heads: PositiveInt
    index_topk: PositiveInt
    num_nextn_predict_layers: int = Field(ge=0)
    rms_norm_eps: PositiveFloat
    bos_token_id: int = Field(ge=0)
    eos_token_id: int = Field(ge=0)


class TopologySection(_Strict):
    """One model replica: attention data parallel and MoE expert parallel on the same ranks."""

    ranks: PositiveInt
    dp: PositiveInt
    ep: PositiveInt
    tp: Literal[1]
    device: Literal["cpu", "cuda", "npu"]
    dtype: DType
    backend: str = Field(min_length=1)


class WeightsSection(_Strict):
    """How the checkpoint stores its weights, and how the device holds them.

    `dense` and `experts` say what the release ships: projection matrices in FP8 e4m3
    with a 128x128 block scale, routed experts in FP4 e2m1 with a scale per 32 inputs,
    or unquantized (the checkpoint's float tensors). `format` is `as_released` (quantized
    tensors stay quantized on the device and are dequantized inside the kernels) or the
    compute dtype (everything dequantized at load)."""

    format: Literal["as_released", "float32", "bfloat16", "float16"] = "as_released"
    dense: Literal["fp8", "unquantized"] = "unquantized"
    experts: Literal["fp4", "unquantized"] = "unquantized"


class PrefillSection(_Strict):
    tile: PositiveInt
    max_extent: PositiveInt
    slots_per_rank: PositiveInt
    mtp_window: PositiveInt


class LayoutEntry(_Strict):
    """One entry of decode.layouts as written; the plan resolves it into a
    contract.decode_layout.DecodeLayout (with its kernel's name)."""

    k: int = Field(ge=0)
    batch: PositiveInt
    seq: PositiveInt


class DecodeSection(_Strict):
    num_speculative_tokens: list[int] = Field(min_length=1)
    default_num_speculative_tokens: int = Field(ge=0)
    micro_batches: PositiveInt
    layouts: list[LayoutEntry] = Field(min_length=1)
    # Context lengths the compiled graphs are specialized for (ascending, the last is
    # limits.max_model_len): a launch runs the graph of the smallest bucket its longest
    # row fits, reading that bucket's compressed entries and no more.
    context_buckets: list[PositiveInt] = Field(min_length=1)


class PoolGroup(_Strict):
    """One grouped KV/state pool: a page per scheduler block in every layer of `layers`."""

    layers: list[LayerKind] = Field(min_length=1)
    rows_per_page: PositiveInt
    row_width: PositiveInt
    dtype: DType
    policy: Literal["ring", "full"]
    format: Literal["compute", "fp8_ds", "fp8", "fp4"] = "compute"   # entry format


class PoolGroups(_Strict):
    """The seven pool groups; see DESIGN.md section 4."""

    ori: PoolGroup
    cmp_c128: PoolGroup
    cmp_c4: PoolGroup
    idx: PoolGroup
    hca_state: PoolGroup
    csa_state: PoolGroup
    csa_inner_state: PoolGroup


class PoolsSection(_Strict):
    block_size: PositiveInt
    groups: PoolGroups

    def group(self, name: str) -> PoolGroup | None:
        return getattr(self.groups, name, None)


class LimitsSection(_Strict):
    """Serving limits; the CLI may lower them."""

    max_num_batched_tokens: PositiveInt
    long_prefill_token_threshold: PositiveInt
    max_model_len: PositiveInt
    max_num_seqs: PositiveInt


class Spec(_Strict):
    """A whole deployment spec (one YAML file)."""

    model: ModelSection
    topology: TopologySection
    weights: WeightsSection = WeightsSection()
    prefill: PrefillSection
    decode: DecodeSection
    pools: PoolsSection
    limits: LimitsSection
