"""Pool entry formats: how one row of a pool group is stored, and the two functions that
cross between it and the values a kernel computes with (quantize on write, dequantize on
read). A group's format is declared in the spec (specs/*.yaml `pools.groups.<g>.format`);
the sizes are contract/entry_formats.py's.

    compute   the row as it is, in the spec's compute dtype        width x dtype bytes
    fp8_ds    V4's served main entry (DeepSeek's "fp8_ds"): the     nope + 2 rope +
              first nope = width - rope values as FP8 e4m3 in       nope / 64, padded to
              blocks of 64, each block with a power-of-two scale    8 bytes: 584 for a
              (e8m0: its exponent + 127, one byte); the last rope   512-wide head with
              values (the RoPE part) as bfloat16                    64 RoPE dims
    fp8       FP8 e4m3 values, one float32 scale a row (amax/448)   width + 4: 132 at 128
    fp4       FP4 e2m1 codes, two a byte (low nibble first), a      width / 2 + width / 32:
              power-of-two scale (e8m0) per 32 values               68 at 128
    fp8_32    V4.1's window KV, fp4_16 its compressed KV, fp4_32 its index keys and
    fp4_16    queries: whole rows, no rotation (runtime/model/v41_formats.py)
    fp4_32

A stored row is bytes [..., nbytes] (uint8) laid out in that order: values, then the
RoPE part (fp8_ds), then scales, then zero padding. The scales follow the release's
quantizer: a block's scale is 2^ceil(log2(amax / max)) with amax at least a floor (1e-4
for FP8, 6 * 2^-126 for FP4), max 448 (e4m3) or 6 (e2m1), values rounded to the
nearest code. Reads give float32 values; a compute-format group reads its own dtype,
as the pools held before formats existed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.abi import PoolGroup
from contract.entry_formats import FP4_BLOCK, FP8_BLOCK, entry_bytes
from runtime.model import v41_formats
from runtime.model.quant import e2m1_values

FP8_MAX, FP4_MAX = 448.0, 6.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class EntryFormat:
    """Rows of `width` values (the last `rope` of them the RoPE part) in format `name`;
    `dtype`: the compute dtype (a compute-format row's storage). `rotated`: rows are
    stored (and read) in the Hadamard basis, as the indexer's quantized keys are."""

    name: str
    width: int
    rope: int
    dtype: torch.dtype
    rotated: bool = False

    @property
    def packed(self) -> bool:
        return self.name != "compute"

    @property
    def storage(self) -> torch.dtype:
        return torch.uint8 if self.packed else self.dtype

    @property
    def nbytes(self) -> int:
        return entry_bytes(self.name, self.width, self.rope, self.dtype.itemsize)

    @property
    def row(self) -> int:
        """A stored row's last dimension: bytes when packed, else values."""
        return self.nbytes if self.packed else self.width

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """values [..., width] -> stored rows [..., row] (the pool's dtype)."""
        if self.name == "compute":
            return values.to(self.dtype)
        values = hadamard(values.float()) if self.rotated else values.float()
        if self.name in v41_formats.FORMATS:
            parts = v41_formats.encode(self.name, values)
        elif self.name == "fp8_ds":
            nope = self.width - self.rope
            codes, scales = _fp8_blocks(values[..., :nope])
            rope = values[..., nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
            parts = [codes, rope, scales]
        elif self.name == "fp8":
            amax = values.abs().amax(-1, keepdim=True).clamp(min=1e-4)
            scale = amax / FP8_MAX
            codes = (values / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            parts = [codes.view(torch.uint8), scale.contiguous().view(torch.uint8)]
        else:
            parts = list(_fp4_blocks(values))
        pad = self.nbytes - sum(p.shape[-1] for p in parts)
        if pad:
            parts.append(values.new_zeros(*values.shape[:-1], pad, dtype=torch.uint8))
        return torch.cat(parts, -1)

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        """stored rows [..., row] -> values [..., width] in the compute dtype (in the
        Hadamard basis when rotated). An e4m3 or e2m1 code times a power-of-two scale is
        exact in bfloat16 and float32, so fp8_ds and fp4 rows are made in the compute
        dtype itself, without float32 temporaries (a read of many entries is a launch's
        largest buffer); an fp8 row's float32 scale multiplies in float32."""
        if self.name == "compute":
            return stored
        lead = stored.shape[:-1]
        work = self.dtype if self.dtype in (torch.bfloat16, torch.float32) else torch.float32
        if self.name in v41_formats.FORMATS:
            return v41_formats.decode(self.name, stored, self.width, work).to(self.dtype)
        out = torch.empty(*lead, self.width, dtype=work, device=stored.device)
        if self.name == "fp8_ds":       # codes converted as copied into place, then scaled
            nope = self.width - self.rope
            at = nope + 2 * self.rope
            out[..., :nope] = stored[..., :nope].view(torch.float8_e4m3fn)
            scales = _exp2(stored[..., at: at + nope // FP8_BLOCK]).to(work)
            out[..., :nope].view(*lead, nope // FP8_BLOCK, FP8_BLOCK).mul_(scales[..., None])
            out[..., nope:] = stored[..., nope:at].contiguous().view(torch.bfloat16)
            return out.to(self.dtype)
        if self.name == "fp8":
            scale = stored[..., self.width: self.width + 4].contiguous().view(torch.float32)
            codes = stored[..., : self.width].view(torch.float8_e4m3fn)
            return (codes.float() * scale).to(self.dtype)
        half = self.width // 2          # each byte looked up as its two values, then scaled
        pairs = stored[..., :half].reshape(-1).int()
        torch.index_select(_e2m1_pairs(work, stored.device), 0, pairs, out=out.view(-1, 2))
        scales = _exp2(stored[..., half: half + self.width // FP4_BLOCK]).to(work)
        out.view(*lead, self.width // FP4_BLOCK, FP4_BLOCK).mul_(scales[..., None])
        return out.to(self.dtype)

    def as_stored(self, values: torch.Tensor) -> torch.Tensor:
        """values [..., width] as a read gives them back once written, in their own
        dtype: what a kernel attends to for the rows it has just written, so that a
        result does not depend on which call wrote a row (a compute-format row: as it
        is, as before formats existed)."""
        if not self.packed:
            return values
        return self.decode(self.encode(values)).to(values.dtype)

    def round_trip(self, values: torch.Tensor) -> torch.Tensor:
        """values as a read after a write gives them back (float32)."""
        return self.decode(self.encode(values)).float()


def entry_format(group: PoolGroup) -> EntryFormat:
    """The format of a spec's pool group (its values in the group's dtype). Made per call
    (a few fields): graphs trace it, and dynamo would only warn past a cache."""
    return EntryFormat(group.format, group.row_width, group.rope_width,
                       getattr(torch, group.dtype), rotated=group.format in ("fp8", "fp4"))


def index_queries(keys: EntryFormat, q: torch.Tensor) -> torch.Tensor:
    """The indexer's queries [..., dim] in the basis and precision of its keys (format
    `keys`): rotated and through the keys' quantization when they are (the release
    rotates its indexer's queries and keys and simulates FP4 on both; the rotation
    alone would cancel in the scores); V4.1's through its keys' format, unrotated; as
    they are otherwise."""
    if keys.name in v41_formats.FORMATS:
        return keys.round_trip(q).to(q.dtype)
    if not keys.rotated:
        return q
    plain = EntryFormat(keys.name, keys.width, 0, keys.dtype)
    return plain.round_trip(hadamard(q.float()))


def _e2m1_pairs(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the two e2m1 values of each byte (low nibble first)."""
    byte = torch.arange(256, device=device)
    return torch.stack((e2m1_values(byte & 15), e2m1_values(byte >> 4)), -1).to(dtype)


def _exp2(scales: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes -> float32 powers of two."""
    return torch.exp2(scales.float() - 127.0)


def _pow2_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The exponent e of the power-of-two scale 2^e that brings amax within top."""
    return torch.ceil(torch.log2(amax / top))


def _fp8_blocks(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values [..., n] (n a multiple of 64) -> (e4m3 codes [..., n] as bytes, e8m0 scales
    [..., n / 64])."""
    lead, n = values.shape[:-1], values.shape[-1]
    blocks = values.view(*lead, n // FP8_BLOCK, FP8_BLOCK)
    exponent = _pow2_scale(blocks.abs().amax(-1).clamp(min=1e-4), FP8_MAX)
    scaled = (blocks / torch.exp2(exponent)[..., None]).clamp(-FP8_MAX, FP8_MAX)
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).view(*lead, n)
    return codes, (exponent + 127).to(torch.uint8)


def _fp4_blocks(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values [..., n] (n a multiple of 32) -> (packed e2m1 codes [..., n / 2], e8m0
    scales [..., n / 32]): each value to the nearest code of its block's scale."""
    lead, n = values.shape[:-1], values.shape[-1]
    blocks = values.view(*lead, n // FP4_BLOCK, FP4_BLOCK)
    floor = FP4_MAX * 2.0 ** -126
    exponent = _pow2_scale(blocks.abs().amax(-1).clamp(min=floor), FP4_MAX)
    scaled = (blocks / torch.exp2(exponent)[..., None]).clamp(-FP4_MAX, FP4_MAX)
    grid = torch.tensor(_E2M1, device=values.device)
    mids = (grid[1:] + grid[:-1]) / 2
    magnitude = torch.bucketize(scaled.abs(), mids)          # the nearest code, 0..7
    codes = (magnitude + 8 * (scaled < 0)).to(torch.uint8).view(*lead, n // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, (exponent + 127).to(torch.uint8)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] (n a power of two) times the orthonormal Hadamard matrix of size n
    (Sylvester's, scaled by n^-1/2): the indexer's rotation before its keys and queries
    are quantized. Orthonormal, so unquantized scores do not change."""
    n = x.shape[-1]
    matrix = _sylvester(n, x.device)
    return (x.float() @ matrix).to(x.dtype)


def _sylvester(n: int, device: torch.device) -> torch.Tensor:
    if n & (n - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two width, not {n}")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h * n ** -0.5


def fp4_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] through FP4 (e2m1, a power-of-two scale per 32) and back, float32: the
    release's simulation of its indexer's FP4 queries."""
    return EntryFormat("fp4", x.shape[-1], 0, x.dtype).round_trip(x)
