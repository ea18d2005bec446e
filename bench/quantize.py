"""Quantize a checkpoint the way the V4 release stores it: projection matrices in FP8
e4m3 with a power-of-two (e8m0) scale per 128x128 block, routed experts in FP4 e2m1
packed two per byte (low nibble first) with an e8m0 scale per 32 inputs. The embedding,
the head, the router, vectors and mHC tensors stay as they are.

Used by the tests (a small FP8/FP4 checkpoint) and bench/load_memory.py (a large one).

    .venv/bin/python bench/quantize.py SRC_DIR OUT_DIR
"""
from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from contract.checkpoint_layout import is_fp8_projection, is_routed_expert
from runtime.model import quant

E4M3_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The smallest power of two s with amax / s <= top (1 for an all-zero block)."""
    return torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / top, min=2.0 ** -126))))


def fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (e4m3 [out, in], e8m0 block scales [ceil(out/128), ceil(in/128)])."""
    out, inp = weight.shape
    b = quant.FP8_BLOCK
    padded = torch.zeros(-(-out // b) * b, -(-inp // b) * b)
    padded[:out, :inp] = weight.float().abs()
    amax = padded.view(padded.shape[0] // b, b, -1, b).amax(dim=(1, 3))
    scale = _pow2_scale(amax, E4M3_MAX)
    full = scale.repeat_interleave(b, 0)[:out].repeat_interleave(b, 1)[:, :inp]
    return (weight.float() / full).to(quant.FP8), scale.to(torch.float8_e8m0fnu)


def fp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 pairs of e2m1 codes [out, in/2], e8m0 scales [out, in/32]):
    each value rounded to the nearest e2m1 magnitude of its group's scale."""
    out, inp = weight.shape
    groups = weight.float().view(out, inp // quant.FP4_GROUP, quant.FP4_GROUP)
    scale = _pow2_scale(groups.abs().amax(-1), 6.0)                     # [out, in/32]
    scaled = (groups / scale[..., None]).view(out, inp)
    codes = torch.empty(out, inp, dtype=torch.uint8)
    for row in range(0, out, 256):                # bounded temporaries: [256, in, 8]
        part = scaled[row: row + 256]
        nearest = (part.abs()[..., None] - E2M1).abs().argmin(-1).to(torch.uint8)
        codes[row: row + 256] = nearest | ((part < 0).to(torch.uint8) << 3)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


def quantize(name: str, tensor: torch.Tensor,
             floats: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """One tensor of an unquantized checkpoint as the release would store it; the
    tensors left unquantized in `floats` if given (else as they are)."""
    scale = name.removesuffix(".weight") + ".scale"
    if is_routed_expert(name):
        data, s = fp4(tensor)
    elif is_fp8_projection(name, tuple(tensor.shape)):
        data, s = fp8(tensor)
    else:
        keep = floats is not None and tensor.is_floating_point()
        return {name: tensor.to(floats) if keep else tensor}
    return {name: data, scale: s}


def quantized_tensors(directory: Path,
                      floats: torch.dtype | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Each tensor of the checkpoint in `directory`, quantized, one at a time."""
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield quantize(name, f.get_tensor(name), floats)


def quantize_checkpoint(src: Path, out: Path, floats: torch.dtype | None = None) -> Path:
    """Write src (an unquantized checkpoint directory) quantized into out, with src's
    config and tokenizer files; unquantized tensors in `floats` if given."""
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for part in quantized_tensors(src, floats):
        tensors.update(part)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    for extra in src.iterdir():
        if extra.suffix != ".safetensors" and extra.is_file():
            shutil.copy(extra, out / extra.name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(quantize_checkpoint(args.src, args.out))


if __name__ == "__main__":
    main()
