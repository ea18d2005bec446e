"""A deeper model of the embedded model's architecture, for specs/tiny-deep.yaml: the
embedded checkpoint's layers 0-3 as trained, then layers that repeat the kinds of its
layers 1-3 (CSA, HCA, CSA) up to `--layers`, each a copy of its kind's trained layer with
its outputs zeroed (attention wo_b, every expert's and the shared expert's w2) and its
hyper-connection stream mixing made the identity (hc_*_fn zero, the comb base a large
diagonal: Sinkhorn of it is the identity to 1e-6). Such a layer computes in full, costs
what a trained layer costs, and hands its input on unchanged, so the deeper model's
outputs, and its MTP layer's drafts and their acceptance, are the embedded model's.

    .venv/bin/python bench/deep_checkpoint.py [--model models/tiny] [--layers 16] [--out DIR]

Prints the directory (default: $V4SERVE_CACHE_DIR/checkpoints/tiny-deep); builds it only
when it is missing or was built from another checkpoint.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.backends.compiled.graphs import cache_dir  # noqa: E402
from server.cli.spec_check import default_model  # noqa: E402

PATTERN = (1, 2, 3)          # the trained layers whose kinds the new layers repeat
IDENTITY = 30.0              # the comb base's diagonal: softmax of it is I to e^-30


def pass_through(weights: dict[str, torch.Tensor], layer: str, hc: int) -> None:
    """Make `layer` (a "layers.N." prefix) hand its input on: zero its sub-layers'
    outputs and make both hyper-connections' stream mixing the identity."""
    for name, tensor in weights.items():
        if not name.startswith(layer):
            continue
        if name.endswith(("attn.wo_b.weight", ".w2.weight")):
            tensor.zero_()
        elif name.endswith(("hc_attn_fn", "hc_ffn_fn")):
            tensor.zero_()
        elif name.endswith(("hc_attn_base", "hc_ffn_base")):
            tensor[2 * hc:] = (IDENTITY * torch.eye(hc)).reshape(-1)


def build(source: Path, out: Path, layers: int) -> Path:
    config = json.loads((source / "config.json").read_text())
    trained = config["num_hidden_layers"]
    stamp = hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()[:16]
    stamp = f"{stamp} layers={layers}"
    if (out / "source").exists() and (out / "source").read_text() == stamp:
        return out
    weights = load_file(str(source / "model.safetensors"))
    ratios = list(config["compress_ratios"])
    hc = config["hc_mult"]
    for n in range(trained, layers):
        copy = PATTERN[(n - trained) % len(PATTERN)]
        for name, tensor in list(weights.items()):
            if name.startswith(f"layers.{copy}."):
                weights[f"layers.{n}." + name[len(f"layers.{copy}."):]] = tensor.clone()
        pass_through(weights, f"layers.{n}.", hc)
        ratios.insert(n, ratios[copy])
    config.update(num_hidden_layers=layers, compress_ratios=ratios)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    (out / "source").write_text(stamp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model("tiny"))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--out", type=Path, default=cache_dir() / "checkpoints" / "tiny-deep")
    args = parser.parse_args()
    print(build(args.model, args.out, args.layers))


if __name__ == "__main__":
    main()
