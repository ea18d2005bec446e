"""Load an official-format checkpoint into transformers' DeepseekV4ForCausalLM (no MTP):
the baseline the benchmarks compare against."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from tests.model.support import official_name


def load_transformers(directory: Path) -> DeepseekV4ForCausalLM:
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
