"""transformers' DeepseekV4ForCausalLM on an official-format checkpoint: the baseline the
benchmarks compare against and the oracle the tests check against (transformers is a
test and benchmark dependency, never a runtime one)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# transformers' DeepseekV4ForCausalLM names -> the official checkpoint names.
RENAMES = (
    ("model.embed_tokens.", "embed."), ("lm_head.", "head."), ("model.norm.", "norm."),
    ("model.hc_head.hc_", "hc_head_"), ("model.layers.", "layers."),
    (".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
    (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
    (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
    (".self_attn.compressor.", ".attn.compressor."), (".self_attn.", ".attn."),
    (".compressor.kv_proj.", ".compressor.wkv."), (".compressor.gate_proj.", ".compressor.wgate."),
    (".compressor.kv_norm.", ".compressor.norm."),
    (".compressor.position_bias", ".compressor.ape"),
    (".attn.q_a_proj.", ".attn.wq_a."), (".attn.q_a_norm.", ".attn.q_norm."),
    (".attn.q_b_proj.", ".attn.wq_b."), (".attn.kv_proj.", ".attn.wkv."),
    (".attn.o_a_proj.", ".attn.wo_a."), (".attn.o_b_proj.", ".attn.wo_b."),
    (".attn.sinks", ".attn.attn_sink"), (".mlp.gate.e_score_correction_bias", ".ffn.gate.bias"),
    (".mlp.shared_experts.gate_proj.", ".ffn.shared_experts.w1."),
    (".mlp.shared_experts.up_proj.", ".ffn.shared_experts.w3."),
    (".mlp.shared_experts.down_proj.", ".ffn.shared_experts.w2."), (".mlp.", ".ffn."),
    (".input_layernorm.", ".attn_norm."), (".post_attention_layernorm.", ".ffn_norm."),
    (".attn_hc.", ".hc_attn_"), (".ffn_hc.", ".hc_ffn_"),
)


def official_name(name: str) -> str:
    for old, new in RENAMES:
        name = name.replace(old, new)
    return name


def load_transformers(directory: Path) -> torch.nn.Module:
    """The checkpoint in `directory` as a float32 DeepseekV4ForCausalLM, in eval mode."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = json.loads((directory / "config.json").read_text())
    keep = {k: v for k, v in config.items() if k not in ("architectures", "model_type",
                                                          "torch_dtype", "quantization_config")}
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**keep)).float().eval()
    tensors = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    state = {}
    for name, param in model.state_dict().items():
        official = official_name(name)
        if official.endswith("ffn.experts.gate_up_proj"):
            prefix = official.removesuffix("gate_up_proj")
            state[name] = torch.stack([torch.cat((tensors[f"{prefix}{e}.w1.weight"],
                                                  tensors[f"{prefix}{e}.w3.weight"]))
                                       for e in range(param.shape[0])])
        elif official.endswith("ffn.experts.down_proj"):
            prefix = official.removesuffix("down_proj")
            state[name] = torch.stack([tensors[f"{prefix}{e}.w2.weight"]
                                       for e in range(param.shape[0])])
        else:
            state[name] = tensors[official]
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model
