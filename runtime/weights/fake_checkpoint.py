"""A checkpoint with every tensor a spec's release holds, at its real shape and stored
dtype, and no data: what a rehearsal loads under FakeTensorMode (runtime/device/
rehearsal.py), so that V4-Flash or V4-Pro's weights "load" on a machine without the
memory for them. It answers what the loader asks of a real checkpoint (_Reader's
questions), from the spec alone:

    routed experts    packed FP4 (two values a byte, int8) with e8m0 scales per 32 inputs,
                      when the spec's weights say `experts: fp4`
    projections       FP8 e4m3 with e8m0 scales per 128 x 128 block (V4.1: 32 x 32, its
                      release's FP8 projections only), when `dense: fp8`
    Engram tables     V4.1: FP8 e4m3 rows with an e8m0 scale per 32, as released
    everything else   bfloat16 matrices, float32 vectors and mHC tensors, int32 ids
"""
from __future__ import annotations

from types import ModuleType

import torch

from contract import checkpoint_layout as layout
from contract.model_args import ModelArgs
from runtime.model import quant


class FakeCheckpoint:
    """The spec's release as tensors made by torch.empty (fake ones, under a fake mode)."""

    def __init__(self, spec: ModuleType):
        c = spec.contract
        args = ModelArgs.from_config(spec.architecture.CONFIG)
        self.shapes = layout.expected_shapes(args)
        self.block = layout.fp8_block(args)
        self.fp4 = {n for n in self.shapes if c.WEIGHTS_EXPERTS == "fp4" and
                    layout.is_routed_expert(n)}
        fp8 = (lambda n, s: layout.is_v41_fp8_projection(n)) if args.is_v41 \
            else layout.is_fp8_projection
        self.fp8 = {n for n, s in self.shapes.items() if c.WEIGHTS_DENSE == "fp8" and fp8(n, s)}

    def __enter__(self) -> FakeCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    # -- what the loader checks: a checkpoint made from the layout is always right --
    def weight_names(self) -> set[str]:
        return set(self.shapes)

    def logical_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def scale_names(self) -> list[str]:
        return []

    def unscaled_float8(self, name: str) -> bool:
        return False

    # -- how each tensor is stored --
    def is_fp4(self, name: str) -> bool:
        return name in self.fp4

    def is_fp8(self, name: str) -> bool:
        return name in self.fp8

    def e8m0_scales(self, names: list[str]) -> bool:
        return True

    def raw(self, name: str, float_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A quantized tensor as stored and its scale (uint8 exponents, or float32)."""
        out, inp = self.shapes[name]
        if self.is_fp4(name):
            data = torch.empty((out, inp // 2), dtype=torch.uint8)
            scale = torch.empty((out, inp // layout.FP4_GROUP), dtype=torch.uint8)
        else:
            data = torch.empty((out, inp), dtype=torch.float8_e4m3fn)
            blocks = (-(-out // self.block), -(-inp // self.block))
            scale = torch.empty(blocks, dtype=torch.uint8)
        return data, quant.scale_values(scale) if float_scale else scale

    def stored(self, name: str) -> torch.Tensor:
        """An Engram table (FP8 e4m3) or its scales (e8m0), as released."""
        dtype = torch.float8_e8m0fnu if name.endswith(".scale") else torch.float8_e4m3fn
        return torch.empty(self.shapes[name], dtype=dtype)

    def load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """A tensor as stored, or dequantized to `dtype` if it is quantized."""
        if self.is_fp4(name) or self.is_fp8(name):
            return quant.dequantize(*self.raw(name), dtype)
        shape = self.shapes[name]
        if name.endswith("tid2eid"):
            return torch.empty(shape, dtype=torch.int32)
        stored = torch.float32 if layout.keeps_float32(name, len(shape)) else torch.bfloat16
        return torch.empty(shape, dtype=stored)
