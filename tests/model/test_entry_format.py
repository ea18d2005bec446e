"""Pool entry formats (runtime/model/entry_format.py), checked against the layouts as
specified rather than against the module's own helpers:

- sizes: fp8_ds 584 bytes for a 512-wide head with 64 RoPE dims, fp8 width + 4, fp4
  width / 2 + width / 32, compute width x dtype bytes;
- bytes: a NumPy oracle written here from the spec (e4m3 and e2m1 code tables built from
  their bit layouts, power-of-two e8m0 scales found exactly, bfloat16 by round-to-nearest-
  even on the float32 bits, low nibble first, scales after values, zero padding) must give
  exactly what encode() writes, and its dequantization exactly what decode() reads;
- error: within half a code step of each value at its block's scale;
- edges: zero rows, huge and tiny values, e2m1 midpoints, scales at a power of two;
- torch.compile of each round trip equals eager; hadamard is Sylvester's, orthonormal.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from contract.entry_formats import entry_bytes
from runtime.model.entry_format import EntryFormat, fp4_round_trip, hadamard

_b = np.arange(127)  # e4m3 magnitudes by code; 0x7F is NaN
E4M3 = np.where(_b >> 3 == 0, (_b & 7) / 8 * 2.0**-6, (1 + (_b & 7) / 8) * 2.0 ** ((_b >> 3) - 7))
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
PACKED = [("fp8_ds", 512, 64), ("fp8_ds", 192, 64), ("fp8", 128, 0), ("fp8", 64, 0),
          ("fp4", 128, 0), ("fp4", 64, 0)]


def exponent(amax: float, floor: float, top: float) -> int:
    """The smallest e with max(amax, floor) <= top * 2^e, exactly."""
    a = max(float(amax), floor)
    e = math.ceil(math.log2(a / top))
    while top * 2.0 ** (e - 1) >= a:
        e -= 1
    while top * 2.0**e < a:
        e += 1
    return e


def nearest(grid: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest each v >= 0 (ties to the even index)."""
    i = np.clip(np.searchsorted(grid, v), 1, len(grid) - 1)
    up, down = grid[i] - v, v - grid[i - 1]
    return np.where((down > up) | ((down == up) & (i % 2 == 0)), i, i - 1)


def codes(grid: np.ndarray, v: np.ndarray, sign: int) -> np.ndarray:
    v = np.clip(v, -grid[-1], grid[-1])
    return (nearest(grid, np.abs(v)) | sign * np.signbit(v)).astype(np.uint8)


def values(grid: np.ndarray, c: np.ndarray, sign: int) -> np.ndarray:
    return np.where(c & sign, -1.0, 1.0) * grid[c & (sign - 1)]


def bf16_bytes(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)


def oracle_row(name: str, x: np.ndarray, rope: int) -> tuple[np.ndarray, np.ndarray]:
    """One float32 row -> (its stored bytes, the float32 values they hold)."""
    if name == "fp8":
        scale = np.float32(max(np.abs(x).max(), np.float32(1e-4))) / np.float32(448)
        c = codes(E4M3, x / scale, 128)
        held = values(E4M3, c, 128).astype(np.float32) * scale
        return np.concatenate([c, np.array([scale], np.float32).view(np.uint8)]), held
    top, block, floor, sign, grid = ((448.0, 64, 1e-4, 128, E4M3) if name == "fp8_ds"
                                     else (6.0, 32, 6 * 2.0**-126, 8, E2M1))
    nope = len(x) - rope
    parts, scales, held = [], [], []
    for blk in x[:nope].reshape(-1, block).astype(np.float64):
        e = exponent(np.abs(blk).max(), floor, top)
        c = codes(grid, blk / 2.0**e, sign)
        parts.append(c if sign == 128 else c[0::2] | (c[1::2] << 4))
        scales.append(e + 127)
        held.append(values(grid, c, sign) * 2.0**e)
    out = np.concatenate(parts + [bf16_bytes(x[nope:]), np.array(scales, np.uint8)])
    if name == "fp8_ds":
        out = np.concatenate([out, np.zeros(-len(out) % 8, np.uint8)])
    rope_held = bf16_bytes(x[nope:]).view(np.uint16).astype(np.uint32) << 16
    return out, np.concatenate(held + [rope_held.view(np.float32)]).astype(np.float32)


def oracle(fmt: EntryFormat, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [oracle_row(fmt.name, r, fmt.rope) for r in x.reshape(-1, fmt.width).numpy()]
    stored, held = (torch.from_numpy(np.stack(p)) for p in zip(*rows))
    return stored.view(*x.shape[:-1], -1), held.view(x.shape)


def sample(lead: tuple[int, ...], width: int, seed: int) -> torch.Tensor:
    """Rows of varied magnitude, an outlier at 5 (tiny values next to it) and, when
    there are several, an all-zero first row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, width, generator=g) * 10 ** (torch.rand(*lead, 1, generator=g) * 8 - 4)
    x[..., 5] *= 300
    if x.dim() > 1 and x.shape[0] > 1:
        x.view(-1, width)[0] = 0
    return x


def test_sizes():
    assert entry_bytes("fp8_ds", 512, 64, 2) == 584
    assert entry_bytes("fp8_ds", 576, 64, 2) == 648  # 512 + 128 + 8: no padding
    assert entry_bytes("fp8", 128, 0, 2) == 132
    assert entry_bytes("fp4", 128, 0, 2) == 68
    assert EntryFormat("compute", 128, 0, torch.bfloat16).nbytes == 256
    assert EntryFormat("compute", 576, 64, torch.float32).nbytes == 2304
    fmt = EntryFormat("fp8_ds", 512, 64, torch.bfloat16)
    assert (fmt.nbytes, fmt.row, fmt.storage) == (584, 584, torch.uint8)
    with pytest.raises(ValueError):
        entry_bytes("fp6", 128, 0, 2)


def test_compute_is_identity_in_its_dtype():
    fmt, x = EntryFormat("compute", 64, 0, torch.bfloat16), sample((3,), 64, 0)
    stored = fmt.encode(x)
    assert stored.dtype == torch.bfloat16 and fmt.row == 64
    assert torch.equal(fmt.decode(stored), x.to(torch.bfloat16))


@pytest.mark.parametrize("lead", [(), (5,), (2, 4)])
@pytest.mark.parametrize("name,width,rope", PACKED)
def test_encode_decode_match_oracle(name, width, rope, lead):
    fmt = EntryFormat(name, width, rope, torch.bfloat16)
    x = sample(lead, width, seed=width + len(lead))
    want_stored, want_held = oracle(fmt, x)
    stored = fmt.encode(x)
    assert stored.dtype == torch.uint8 and stored.shape == (*lead, fmt.nbytes)
    assert torch.equal(stored, want_stored)
    assert torch.equal(fmt.decode(stored), want_held.to(fmt.dtype))    # in the compute dtype


def test_fp4_round_trip_matches_oracle():
    x = sample((3,), 64, seed=7)
    assert torch.equal(fp4_round_trip(x), oracle(EntryFormat("fp4", 64, 0, x.dtype), x)[1])


def assert_within_half_step(fmt: EntryFormat, x: torch.Tensor):
    """|read - written| <= half a code step at the value's magnitude and block scale."""
    got, x = fmt.round_trip(x).double(), x.double()
    nope = fmt.width - fmt.rope
    if fmt.rope:
        assert torch.equal(got[..., nope:], x[..., nope:].to(torch.bfloat16).double())
    err, x = (got - x)[..., :nope], x[..., :nope]
    if fmt.name == "fp4":
        blocks = x.reshape(-1, 32).abs()
        s = torch.tensor([2.0 ** exponent(b.max(), 6 * 2.0**-126, 6) for b in blocks])
        a = blocks / s[:, None]
        half_gap = torch.where(a <= 2, 0.25, torch.where(a <= 4, 0.5, 1.0)) * s[:, None]
        assert (err.reshape(-1, 32).abs() <= half_gap).all()
        return
    if fmt.name == "fp8":
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448
    else:
        s = torch.tensor([2.0 ** exponent(b.abs().max(), 1e-4, 448)
                          for b in x.reshape(-1, 64)]).repeat_interleave(64).view(x.shape)
    # e4m3: 3 mantissa bits (half step <= 2^-4 |v|), subnormal step 2^-9 (half 2^-10)
    assert (err.abs() <= 2.0**-4 * x.abs() + 2.0**-10 * s).all()


@pytest.mark.parametrize("name,width,rope", PACKED)
def test_round_trip_error_within_half_a_step(name, width, rope):
    fmt = EntryFormat(name, width, rope, torch.bfloat16)
    assert_within_half_step(fmt, sample((2, 4), width, seed=11))
    g = torch.Generator().manual_seed(1)
    for magnitude in (1e30, 1e-30):
        x = torch.randn(3, width, generator=g).sign() * (1 + torch.rand(3, width, generator=g))
        x *= magnitude
        assert torch.isfinite(fmt.round_trip(x)).all()
        assert_within_half_step(fmt, x)


@pytest.mark.parametrize("name,width,rope", PACKED + [("compute", 64, 0)])
def test_zero_rows_read_as_zeros(name, width, rope):
    fmt = EntryFormat(name, width, rope, torch.bfloat16)
    x = torch.stack([torch.zeros(width), torch.full((width,), -0.0)])
    got = fmt.decode(fmt.encode(x)).float()
    assert torch.isfinite(got).all() and (got == 0).all()


def test_e2m1_midpoints_go_to_a_neighbour():
    mids, neighbours = E2M1[:-1] + np.diff(E2M1) / 2, list(zip(E2M1[:-1], E2M1[1:]))
    x, m = torch.zeros(4, 32), torch.from_numpy(mids).float()
    x[:, 0] = 6.0  # block amax 6: scale 2^0, values as they are
    x[:, 1:8] = torch.stack([m, -m, m + 2**-8, -(m - 2**-8)])
    got = fp4_round_trip(x)[:, 1:8].numpy()
    for i, (lo, hi) in enumerate(neighbours):
        assert abs(got[0, i]) in (lo, hi) and got[0, i] == -got[1, i]
        assert (got[2, i], got[3, i]) == (hi, -lo)  # off the midpoint: the nearer code


@pytest.mark.parametrize("name,width,top", [("fp8_ds", 128, 448.0), ("fp4", 32, 6.0)])
def test_power_of_two_scale_boundary(name, width, top):
    fmt = EntryFormat(name, width, 64 if name == "fp8_ds" else 0, torch.bfloat16)
    scale_at = 64 + 2 * 64 if name == "fp8_ds" else 16  # after the values (and RoPE part)
    above = float(np.nextafter(np.float32(top * 4), np.float32(np.inf)))
    for amax, e in [(top * 4, 2), (above, 3), (top / 8, -3)]:
        x = torch.zeros(width)
        x[3] = amax
        stored = fmt.encode(x)
        assert stored[scale_at].item() == e + 127, amax
        assert fmt.decode(stored)[3].item() == pytest.approx(amax, rel=2**-4)


@pytest.mark.slow
def test_compiled_round_trips_equal_eager():
    """Packed formats, float32 values, in one compiled graph: inductor elides a cast pair
    that rounds to bfloat16 and back (a compute-format row, an fp8 row read in bfloat16),
    as it does everywhere in a compiled graph."""
    formats = [EntryFormat(name, width, rope, torch.float32) for name, width, rope in PACKED]
    xs = [sample((2, 3), fmt.width, seed=3) for fmt in formats]

    def every(*xs):
        return [fmt.round_trip(x) for fmt, x in zip(formats, xs)]

    for fmt, got, x in zip(formats, torch.compile(every)(*xs), xs):
        assert torch.equal(got, fmt.round_trip(x)), fmt


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_hadamard_is_sylvester_and_orthonormal(n):
    i = np.arange(n)
    popcount = np.vectorize(lambda v: bin(v).count("1"))(i[:, None] & i[None, :])
    want = torch.from_numpy((-1.0) ** popcount / math.sqrt(n)).float()
    torch.testing.assert_close(hadamard(torch.eye(n)), want, atol=1e-7, rtol=0)
    x, y = torch.randn(2, 5, n, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(hadamard(hadamard(x)), x, atol=1e-5, rtol=0)
    torch.testing.assert_close((hadamard(x) * hadamard(y)).sum(-1), (x * y).sum(-1),
                               atol=1e-5, rtol=1e-5)
    assert hadamard(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("n", [3, 96, 576])
def test_hadamard_rejects_other_widths(n):
    with pytest.raises(ValueError):
        hadamard(torch.ones(2, n))
