"""Load a checkpoint directory in the official DeepSeek V4 release format.

    config.json                       checked against the spec's model section
    *.safetensors (+ index json)      official tensor names (embed.weight,
                                      layers.N.attn.wq_a.weight, mtp.0.e_proj.weight, ...)

FP8 e4m3 weights with 128x128 block scales (`X.scale`) and FP4 e2m1 expert weights
(int8, two values per byte, low nibble first, one e8m0 scale per 32 inputs) are
dequantized at load. Routed experts are stacked per layer in expert order, so expert e
sits with the other experts of its rank e // experts_per_rank.
A missing, extra or mis-shaped tensor, or a config.json that disagrees with the spec,
is a CheckpointError naming the tensor or key.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from runtime.model.args import ModelArgs
from runtime.model.params import Experts, ModelParams
from runtime.model.rope import Rope

FP8_BLOCK = 128
FP4_GROUP = 32
# e2m1 code -> value; bit 3 is the sign.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class CheckpointError(ValueError):
    """The checkpoint does not fit the spec: names the file, tensor or key."""


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a checkpoint of this architecture, with its shape."""
    d = args.dim
    shapes = {
        "embed.weight": (args.vocab_size, d), "head.weight": (args.vocab_size, d),
        "norm.weight": (d,), **_hc_head("", args),
    }
    for layer in range(args.n_layers + args.n_mtp_layers):
        prefix = args.prefix(layer)
        shapes.update({prefix + k: v for k, v in _layer_shapes(args, layer).items()})
        if layer >= args.n_layers:
            shapes.update({
                prefix + "e_proj.weight": (d, d), prefix + "h_proj.weight": (d, d),
                prefix + "enorm.weight": (d,), prefix + "hnorm.weight": (d,),
                prefix + "norm.weight": (d,), **_hc_head(prefix, args),
            })
    return shapes


def _hc_head(prefix: str, args: ModelArgs) -> dict[str, tuple[int, ...]]:
    hc = args.hc_mult
    return {prefix + "hc_head_fn": (hc, hc * args.dim), prefix + "hc_head_base": (hc,),
            prefix + "hc_head_scale": (1,)}


def _layer_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    d, hc, D, H = args.dim, args.hc_mult, args.head_dim, args.n_heads
    mix = (2 + hc) * hc
    shapes: dict[str, tuple[int, ...]] = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,)}
    for site in ("attn", "ffn"):
        shapes.update({f"hc_{site}_fn": (mix, hc * d), f"hc_{site}_base": (mix,),
                       f"hc_{site}_scale": (3,)})
    shapes.update({
        "attn.wq_a.weight": (args.q_lora_rank, d), "attn.q_norm.weight": (args.q_lora_rank,),
        "attn.wq_b.weight": (H * D, args.q_lora_rank), "attn.wkv.weight": (D, d),
        "attn.kv_norm.weight": (D,), "attn.attn_sink": (H,),
        "attn.wo_a.weight": (args.o_groups * args.o_lora_rank, H * D // args.o_groups),
        "attn.wo_b.weight": (d, args.o_groups * args.o_lora_rank),
    })
    kind = args.kind(layer)
    if kind in ("csa", "hca"):
        shapes.update(_compressor("attn.compressor.", args.ratio(layer), D, d))
    if kind == "csa":
        DI, HI = args.index_head_dim, args.index_heads
        shapes.update(_compressor("attn.indexer.compressor.", args.ratio(layer), DI, d))
        shapes.update({"attn.indexer.wq_b.weight": (HI * DI, args.q_lora_rank),
                       "attn.indexer.weights_proj.weight": (HI, d)})
    shapes.update(_ffn_shapes(args, layer))
    return shapes


def _compressor(prefix: str, ratio: int, width: int, d: int) -> dict[str, tuple[int, ...]]:
    coff = 2 if ratio == 4 else 1
    return {prefix + "wkv.weight": (coff * width, d), prefix + "wgate.weight": (coff * width, d),
            prefix + "ape": (ratio, coff * width), prefix + "norm.weight": (width,)}


def _ffn_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    d, inter, shared = args.dim, args.moe_inter, args.moe_inter * args.n_shared_experts
    shapes: dict[str, tuple[int, ...]] = {"ffn.gate.weight": (args.n_experts, d)}
    if args.is_hash(layer):
        shapes["ffn.gate.tid2eid"] = (args.vocab_size, args.n_active)
    else:
        shapes["ffn.gate.bias"] = (args.n_experts,)
    for e in range(args.n_experts):
        shapes.update({f"ffn.experts.{e}.w1.weight": (inter, d),
                       f"ffn.experts.{e}.w2.weight": (d, inter),
                       f"ffn.experts.{e}.w3.weight": (inter, d)})
    shapes.update({"ffn.shared_experts.w1.weight": (shared, d),
                   "ffn.shared_experts.w2.weight": (d, shared),
                   "ffn.shared_experts.w3.weight": (shared, d)})
    return shapes


def check_config(directory: Path, spec_config: Mapping[str, Any], spec_path: str) -> None:
    """config.json must agree with the spec's model section on every key it declares."""
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read config.json: {exc}") from None
    for key, want in spec_config.items():
        if key not in config:
            raise CheckpointError(f"{path}: lacks {key!r}, which {spec_path} sets to {want!r}")
        if not _same(config[key], want):
            raise CheckpointError(f"{path}: {key} is {config[key]!r} but {spec_path} says "
                                  f"{want!r}; write a spec for this checkpoint with "
                                  "`v4serve spec new --from-config`")


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and set(got) >= set(want) \
            and all(_same(got[k], v) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) \
            and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0)
    return got == want


def load_params(directory: str | Path, spec: Any, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None, held: range | None = None) -> ModelParams:
    """Load a checkpoint for a generated spec package (generated.<name>): the dense
    tensors and the routed experts of the ranks `held` (default: every rank)."""
    directory = Path(directory)
    config = spec.architecture.CONFIG
    check_config(directory, config, spec.SPEC_PATH)
    args = ModelArgs.from_config(config)
    dtype = dtype or getattr(torch, spec.contract.DTYPE)
    device = torch.device(device)
    ranks = spec.contract.EP
    held = held if held is not None else range(ranks)
    per = args.n_experts // ranks
    with _Reader(directory) as reader:
        shapes = expected_shapes(args)
        _check_names(reader, shapes, directory)
        dense = {name: _convert(reader.load(name, shape), name, dtype, device)
                 for name, shape in shapes.items() if ".experts." not in name}
        experts = {layer: _experts(reader, args, layer, dtype, device,
                                   range(held.start * per, held.stop * per))
                   for layer in range(args.n_layers + args.n_mtp_layers)}
    return ModelParams(args=args, fingerprint=spec.architecture.FINGERPRINT, dense=dense,
                       experts=experts, rope=Rope.build(args, device), dtype=dtype,
                       device=device, ranks=ranks)


def _convert(t: torch.Tensor, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Matrices take the compute dtype; vectors, mHC and ape stay float32; ids stay ints."""
    if not t.is_floating_point():
        return t.to(device)
    keep_fp32 = t.dim() == 1 or "hc_" in name or name.endswith(".ape")
    return t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)


def _experts(reader: _Reader, args: ModelArgs, layer: int, dtype: torch.dtype,
             device: torch.device, which: range) -> Experts:
    """The routed experts `which` of a layer, stacked in expert order (rank by rank)."""
    prefix = args.prefix(layer) + "ffn.experts."
    w1 = reader.load(f"{prefix}{which.start}.w1.weight", None)
    w2 = reader.load(f"{prefix}{which.start}.w2.weight", None)
    inter = w1.shape[0]
    w13 = torch.empty((len(which), 2 * inter, w1.shape[1]), dtype=dtype, device=device)
    w2s = torch.empty((len(which), *w2.shape), dtype=dtype, device=device)
    for i, e in enumerate(which):     # one expert at a time: no whole-layer host copy
        w13[i, :inter] = w1 if i == 0 else reader.load(f"{prefix}{e}.w1.weight", None)
        w13[i, inter:] = reader.load(f"{prefix}{e}.w3.weight", None)
        w2s[i] = w2 if i == 0 else reader.load(f"{prefix}{e}.w2.weight", None)
    return Experts(w13, w2s, which.start)


def _check_names(reader: _Reader, shapes: dict[str, tuple[int, ...]], directory: Path) -> None:
    have = reader.weight_names()
    missing = sorted(set(shapes) - have)
    extra = sorted(have - set(shapes))
    if missing:
        raise CheckpointError(f"{directory}: missing tensor {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if extra:
        raise CheckpointError(f"{directory}: unexpected tensor {extra[0]} for this spec"
                              + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, shape in shapes.items():
        got = reader.logical_shape(name)
        if got != shape:
            raise CheckpointError(f"{directory}: tensor {name} has shape {got}, expected {shape}")


class _Reader:
    """Tensors of every safetensors file of a directory, by name; `X.scale` tensors
    are folded into their `X.weight` by dequantization."""

    def __init__(self, directory: Path):
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{directory}: no *.safetensors files")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._where.clear()
        self._handles.clear()

    def weight_names(self) -> set[str]:
        return {n for n in self._where if not n.endswith(".scale")}

    def logical_shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(self._where[name].get_slice(name).get_shape())
        if self._is_fp4(name):
            return (shape[0], shape[1] * 2)
        return shape

    def _is_fp4(self, name: str) -> bool:
        scale = name.removesuffix(".weight") + ".scale"
        packed = self._where[name].get_slice(name).get_dtype() in ("I8", "U8")
        return packed and scale in self._where

    def load(self, name: str, shape: tuple[int, ...] | None) -> torch.Tensor:
        tensor = self._where[name].get_tensor(name)
        scale_name = name.removesuffix(".weight") + ".scale"
        if scale_name not in self._where:
            return tensor
        scale = _scale_values(self._where[scale_name].get_tensor(scale_name))
        if tensor.dtype in (torch.int8, torch.uint8):
            return dequantize_fp4(tensor, scale)
        return dequantize_fp8(tensor, scale)


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 scales (a float8_e8m0fnu tensor or raw exponent bytes) as float32 powers of 2."""
    if scale.dtype == torch.uint8:
        return torch.pow(2.0, scale.float() - 127.0)
    return scale.float()


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 weight [out, in] times its 128x128 block scale [ceil(out/128), ceil(in/128)]."""
    out, inp = weight.shape
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:out].repeat_interleave(FP8_BLOCK, 1)[:, :inp]
    return weight.float() * full


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e2m1 pairs [out, in/2] (low nibble first) times one scale per 32 inputs [out, in/32]."""
    raw = packed.view(torch.uint8)
    codes = torch.stack((raw & 0x0F, raw >> 4), dim=-1).flatten(-2).long()     # [out, in]
    values = torch.tensor(FP4_VALUES, dtype=torch.float32, device=packed.device)[codes]
    return values * scale.repeat_interleave(FP4_GROUP, 1)[:, : values.shape[1]]


def bytes_per_rank(params: ModelParams) -> int:
    """What one rank holds: every dense tensor (replicated) and its share of the routed
    experts."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in params.dense.values()}      # a fused tensor and its views: once
    dense = sum(storages.values())
    stacks = params.experts.values()
    routed = sum(t.numel() * t.element_size() for e in stacks for t in (e.w1, e.w2, e.w3))
    held = sum(e.count for e in stacks)
    return dense + (routed * params.experts_per_rank * len(params.experts) // held
                    if held else 0)
