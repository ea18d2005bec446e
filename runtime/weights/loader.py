"""Load a checkpoint directory in the official DeepSeek V4 release format.

    config.json                       checked against the spec's model section
    *.safetensors (+ index json)      official tensor names (embed.weight,
                                      layers.N.attn.wq_a.weight, mtp.0.e_proj.weight, ...)

FP8 e4m3 weights with 128x128 block scales (`X.scale`) and FP4 e2m1 expert weights
(int8, two values per byte, low nibble first, one e8m0 scale per 32 inputs) stay as
released on the device (the spec's `weights.format: as_released`) with their scales,
and the kernels dequantize them (runtime/model/quant.py); with `weights.format` a dtype
they are dequantized here, by the same arithmetic. The embedding and the head are always
dequantized (a gather and the logits read them whole).

Loading streams: one tensor at a time is read from its file and sent to the device, and
the routed experts of a rank go only to it. Routed experts are stacked per layer in
expert order, so expert e sits with the other experts of its rank e // experts_per_rank.
A missing, extra or mis-shaped tensor, or a config.json that disagrees with the spec,
is a CheckpointError naming the tensor or key.

A DeepSeek V4.1 checkpoint (contract/checkpoint_layout.py's V4.1 names) loads the same
way, less what text serving never reads: the vision tower, aligner, image_* tensors and
every ffn.gate.bias_vl are skipped (one log line). Its Engram tables stay as released
(FP8 e4m3 rows with an e8m0 scale per 32), and the Engram token map is built from the
checkpoint's tokenizer.json (runtime/model/engram.py).
"""
from __future__ import annotations

import ctypes
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from contract.checkpoint_layout import (
    expected_shapes,
    fp8_block,
    is_engram_table,
    is_fp8_projection,
    is_routed_expert,
    keeps_float32,
)
from contract.model_args import ModelArgs
from contract.v41_config import is_v41, text_config
from runtime.model import quant
from runtime.model.engram import EngramGeometry, EngramHash
from runtime.model.params import Experts, ModelParams
from runtime.model.rope import Rope
from runtime.weights.safetensors_file import SafetensorsError, SafetensorsFile

E8M0 = ("U8", "F8_E8M0")                         # power-of-two scales, one byte each
SCALE_DTYPES = (*E8M0, "F32", "BF16", "F16")
# what a V4.1 release holds for images only: text serving never reads them
TEXT_ONLY_SKIPPED = ("vision.", "aligner.", "image_start", "image_end", "image_newline")
SKIPPED_SUFFIX = ".ffn.gate.bias_vl"

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """The checkpoint does not fit the spec: names the file, tensor or key."""


def check_config(directory: Path, spec_config: Mapping[str, Any], spec_path: str) -> None:
    """config.json must agree with the spec's model section on every key it declares."""
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read config.json: {exc}") from None
    if is_v41(config):                 # a spec's model section is the flat text spelling
        config = text_config(config)
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


def load_params(directory: str | Path | None, spec: Any, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None, held: range | None = None,
                weight_format: str | None = None, checkpoint: Any = None,
                ranks: int | None = None) -> ModelParams:
    """Load a checkpoint for a generated spec package (generated.<name>): the dense
    tensors and the routed experts of the ranks `held` (default: every rank) of the
    spec's expert parallelism (or of `ranks` that split the experts evenly), quantized
    tensors as released or dequantized (`weight_format`, default the spec's). From the
    safetensors files of `directory`, or from `checkpoint` (a FakeCheckpoint: the
    release's shapes and dtypes, no data)."""
    config = spec.architecture.CONFIG
    if checkpoint is None:
        directory = Path(directory)
        check_config(directory, config, spec.SPEC_PATH)
    return load_checkpoint(directory, ModelArgs.from_config(config),
                           spec.architecture.FINGERPRINT,
                           dtype or getattr(torch, spec.contract.DTYPE), device,
                           ranks or spec.contract.EP, held,
                           (weight_format or spec.contract.WEIGHTS_FORMAT) == "as_released",
                           checkpoint)


def load_checkpoint(directory: str | Path | None, args: ModelArgs, fingerprint: str,
                    dtype: torch.dtype, device: str | torch.device = "cpu", ranks: int = 1,
                    held: range | None = None, as_released: bool = False,
                    checkpoint: Any = None) -> ModelParams:
    """Load the checkpoint of architecture `args` (its config.json is not read): what
    load_params does once a spec has given these."""
    device = torch.device(device)
    for layer in range(args.n_layers + args.n_mtp_layers):
        if args.experts(layer) % ranks:
            raise ValueError(f"{ranks} ranks: the {args.experts(layer)} routed experts of "
                             f"layer {layer} must split evenly")
    held = held if held is not None else range(ranks)
    with checkpoint or _Reader(Path(directory), fp8_block(args)) as reader:
        shapes = expected_shapes(args)
        _check_names(reader, shapes, directory)
        dense: dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():       # one tensor at a time, to the device
            if is_engram_table(name):
                dense[name] = reader.stored(name).to(device)
            elif not is_routed_expert(name):
                dense.update(_dense(reader, name, shape, dtype, device, as_released))
        experts = {}
        for layer in range(args.n_layers + args.n_mtp_layers):
            per = args.experts(layer) // ranks
            experts[layer] = _experts(reader, args, layer, dtype, device,
                                      range(held.start * per, held.stop * per), as_released)
    _return_freed_heap()
    return ModelParams(args=args, fingerprint=fingerprint, dense=dense, experts=experts,
                       rope=Rope.build(args, device), dtype=dtype, device=device,
                       ranks=ranks, engram=_engram_hash(args, directory, device))


def _engram_hash(args: ModelArgs, directory: str | Path | None,
                 device: torch.device) -> EngramHash | None:
    """V4.1's Engram token map and hash constants, from the checkpoint's tokenizer.json;
    None without Engram layers (or, for a checkpoint without files, without a
    tokenizer)."""
    if not args.engram_layers:
        return None
    path = Path(directory) / "tokenizer.json" if directory is not None else None
    if path is None or not path.exists():
        if directory is None:
            return None
        raise CheckpointError(f"{directory}: no tokenizer.json, which the Engram token map "
                              "is built from")
    geometry = EngramGeometry(args.engram_layers, args.engram_num_embeddings,
                              args.engram_max_ngram, args.engram_vocab_size, args.engram_heads,
                              args.engram_head_dim, args.engram_pad_id,
                              args.engram_compressed_vocab)
    return EngramHash.from_tokenizer_file(geometry, path, args.vocab_size, device)


def _return_freed_heap() -> None:
    """Give the host memory the load's temporaries freed back to the system (glibc keeps
    freed heap pages mapped; malloc_trim unmaps them). A no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _dense(reader: _Reader, name: str, shape: tuple[int, ...], dtype: torch.dtype,
           device: torch.device, as_released: bool) -> dict[str, torch.Tensor]:
    """{name: tensor} on the device, or {name: FP8 data, its scale name: scale}."""
    if as_released and reader.is_fp8(name) and is_fp8_projection(name, shape):
        data, scale = reader.raw(name)
        return {name: data.to(device), quant.scale_name(name): scale.to(device)}
    return {name: _convert(reader.load(name, dtype), name, dtype, device)}


def _convert(t: torch.Tensor, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Matrices take the compute dtype; vectors, mHC and ape stay float32; ids stay ints."""
    if not t.is_floating_point():
        return t.to(device)
    return t.to(device=device, dtype=torch.float32 if keeps_float32(name, t.dim()) else dtype)


def _experts(reader: _Reader, args: ModelArgs, layer: int, dtype: torch.dtype,
             device: torch.device, which: range, as_released: bool) -> Experts:
    """The routed experts `which` of a layer, stacked in expert order (rank by rank),
    filled one expert matrix at a time: no whole-layer host copy."""
    prefix = args.prefix(layer) + "ffn.experts."
    names = [(f"{prefix}{e}.w1.weight", f"{prefix}{e}.w3.weight", f"{prefix}{e}.w2.weight")
             for e in which]
    # packed only if every expert of the layer is: a stack holds one format
    flat = [n for trio in names for n in trio]
    packed = as_released and all(reader.is_fp4(n) for n in flat)
    float_scales = packed and not reader.e8m0_scales(flat)     # a stack: one scale dtype

    def read(name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        return reader.raw(name, float_scales) if packed else (reader.load(name, dtype), None)

    stacks: list[torch.Tensor | None] = [None] * 4      # w13, w2, w13 scale, w2 scale
    for i, (w1_name, w3_name, w2_name) in enumerate(names):
        w1, w1s = read(w1_name)
        w3, w3s = read(w3_name)
        w2, w2s = read(w2_name)
        parts = (torch.cat((w1, w3)), w2) + ((torch.cat((w1s, w3s)), w2s) if packed else ())
        for k, part in enumerate(parts):
            if stacks[k] is None:
                stacks[k] = torch.empty((len(which), *part.shape), device=device,
                                        dtype=part.dtype if packed else dtype)
            stacks[k][i] = part
    return Experts(stacks[0], stacks[1], which.start, stacks[2], stacks[3])


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
    for scale in reader.scale_names():
        problem = reader.scale_problem(scale, shapes)
        if problem:
            raise CheckpointError(f"{directory}: {problem}")
    for name in shapes:
        if reader.unscaled_float8(name):
            raise CheckpointError(f"{directory}: tensor {name} is float8 without a scale")


class _Reader:
    """Tensors of every safetensors file of a directory, by name, each read when asked
    for (runtime/weights/safetensors_file.py: no file is mapped); `X.scale` tensors go with
    their `X.weight`."""

    def __init__(self, directory: Path, fp8_block: int = quant.FP8_BLOCK):
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{directory}: no *.safetensors files")
        self._handles: list[SafetensorsFile] = []
        try:
            for f in files:
                self._handles.append(SafetensorsFile(f))
        except (OSError, SafetensorsError) as exc:
            self.close()
            raise CheckpointError(str(exc)) from None
        every = {name: h for h in self._handles for name in h.keys()}
        self._where = {n: h for n, h in every.items() if not _image_only(n)}
        if len(self._where) < len(every):
            log.info("%s: skipped %d tensors text serving never reads (vision tower, aligner, "
                     "image tokens, ffn.gate.bias_vl)", directory, len(every) - len(self._where))
        self.fp8_block = fp8_block       # the side of an FP8 weight's scale block

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.close()
        self._handles.clear()

    def weight_names(self) -> set[str]:
        """Every tensor but the scales of quantized weights (an Engram table's scale is a
        tensor of its own)."""
        return {n for n in self._where if not n.endswith(".scale") or is_engram_table(n)}

    def logical_shape(self, name: str) -> tuple[int, ...]:
        shape = self._where[name].shape(name)
        if self.is_fp4(name) and len(shape) == 2:
            return (shape[0], shape[1] * 2)
        return shape

    def unscaled_float8(self, name: str) -> bool:
        return self._dtype(name).startswith("F8") and not self._scaled(name) \
            and not is_engram_table(name)

    def is_fp4(self, name: str) -> bool:
        return self._scaled(name) and self._dtype(name) in ("I8", "U8")

    def is_fp8(self, name: str) -> bool:
        return self._scaled(name) and self._dtype(name) == "F8_E4M3"

    def scale_names(self) -> list[str]:
        return [n for n in self._where if n.endswith(".scale") and not is_engram_table(n)]

    def scale_problem(self, scale: str, shapes: dict[str, tuple[int, ...]]) -> str | None:
        """What is wrong with a `.scale` tensor: no weight of its name, a weight that is
        neither FP8 e4m3 nor packed FP4, or a shape other than its weight's blocks."""
        name = scale.removesuffix(".scale") + ".weight"
        if name not in shapes:
            return f"unexpected tensor {scale} for this spec"
        if len(shapes[name]) != 2:
            return f"tensor {name} has a scale, but only matrices are quantized"
        if not (self.is_fp8(name) or self.is_fp4(name)):
            return (f"tensor {name} has a scale but is stored as {self._dtype(name)}; "
                    "scaled weights are F8_E4M3 or FP4 pairs in I8/U8")
        if self._dtype(scale) not in SCALE_DTYPES:
            return f"scale {scale} is stored as {self._dtype(scale)}; one of {SCALE_DTYPES}"
        out, inp = shapes[name]
        block = self.fp8_block
        want = (-(-out // block), -(-inp // block)) if self.is_fp8(name) \
            else (out, inp // quant.FP4_GROUP)
        got = self._where[scale].shape(scale)
        return None if got == want else f"scale {scale} has shape {got}, expected {want}"

    def e8m0_scales(self, names: list[str]) -> bool:
        """Whether the scales of these weights are all e8m0 (else read them as float)."""
        return all(self._dtype(quant.scale_name(n)) in E8M0 for n in names)

    def _scaled(self, name: str) -> bool:
        return name.removesuffix(".weight") + ".scale" in self._where

    def _dtype(self, name: str) -> str:
        return self._where[name].dtype(name)

    def raw(self, name: str, float_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A quantized tensor as stored (FP8 e4m3, or FP4 pairs as uint8) and its scale
        (e8m0 as uint8 exponents, or float32: always with `float_scale`)."""
        data = self._where[name].read(name)
        scale_name = quant.scale_name(name)
        scale = self._where[scale_name].read(scale_name)
        data = data.view(torch.uint8) if data.dtype == torch.int8 else data
        if scale.dtype == torch.float8_e8m0fnu:
            scale = scale.view(torch.uint8)
        if float_scale or scale.dtype != torch.uint8:
            scale = quant.scale_values(scale)
        return data, scale

    def stored(self, name: str) -> torch.Tensor:
        """A tensor exactly as stored (an Engram table or its e8m0 scales)."""
        return self._where[name].read(name)

    def load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """A tensor as stored, or dequantized to `dtype` if it has a scale (checked by
        scale_problem to be FP8 or FP4)."""
        if not self._scaled(name):
            return self._where[name].read(name)
        return quant.dequantize(*self.raw(name), dtype)


def _image_only(name: str) -> bool:
    """A V4.1 release's tensor that only image inputs use."""
    return name.startswith(TEXT_ONLY_SKIPPED) or name.endswith(SKIPPED_SUFFIX)


def bytes_per_rank(params: ModelParams) -> int:
    """What one rank holds: every dense tensor (replicated) and its share of the routed
    experts."""
    dense, routed = _held_bytes(params)
    held = sum(e.count for e in params.experts.values())
    return dense + (routed * params.experts_per_rank * len(params.experts) // held
                    if held else 0)


def resident_bytes(params: ModelParams) -> int:
    """What this process holds: the dense tensors once and every routed expert loaded."""
    return sum(_held_bytes(params))


def _held_bytes(params: ModelParams) -> tuple[int, int]:
    """(dense bytes, routed expert bytes) of the tensors loaded here."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in params.dense.values()}      # a fused tensor and its views: once
    routed = sum(t.numel() * t.element_size()
                 for e in params.experts.values() for t in e.tensors())
    return sum(storages.values()), routed
