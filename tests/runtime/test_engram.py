"""V4.1 Engram (runtime/model/engram.py) against the v41-tiny fixture and hand-built values.

The reference computations here are written out independently (loops over Python ints
and floats, the constants of the facts), so a wrong column order, offset, multiplier,
scale group or gate normalization makes them disagree."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from runtime.model.engram import (
    EngramGeometry,
    EngramHash,
    EngramWeights,
    add_engram,
    compressed_token_map,
    lookup,
    next_history,
    ngram_windows,
    vocabulary_texts,
)
from runtime.weights.safetensors_file import SafetensorsFile

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "v41-tiny"
CONFIG = json.loads((FIXTURE / "inference" / "config.json").read_text())

# the tiny's constants as the official code derives them (layer 1, layer 4)
PRIMES = ((61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109),
          (113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179))
MULTIPLIERS = ((16365576856497055, 1033605607410825, 7679560020407249, 15800761300489279),
               (17567520658102759, 1075872601616057, 15729457121832067, 4048007069441095))
PAD = 2        # the compressed id of raw id 2


@pytest.fixture(scope="module")
def geometry() -> EngramGeometry:
    return EngramGeometry.from_config(CONFIG)


@pytest.fixture(scope="module")
def engram_hash(geometry) -> EngramHash:
    return EngramHash.from_tokenizer_file(geometry, FIXTURE / "tokenizer.json", 512)


def tiny_compressed(token_id: int) -> int:
    """The tiny's map written out: T64..T95 (448..479) and ｔ96..ｔ111 (480..495) fold onto
    t64..t111; every other token is its own key, numbered in order."""
    if 448 <= token_id < 496:
        return token_id - 384
    return token_id if token_id < 448 else token_id - 48


def test_geometry_constants(geometry):
    assert geometry.primes == PRIMES
    assert geometry.multipliers().tolist() == [list(m) for m in MULTIPLIERS]
    hf = json.loads((FIXTURE / "config.json").read_text())["text_config"]
    assert EngramGeometry.from_config(hf) == geometry        # engram_pad_token_id spelling
    with pytest.raises(ValueError, match="sum of its primes"):
        EngramGeometry.from_config({**CONFIG, "engram_num_embeddings": [1040, 1787]})


def test_token_map_of_the_tiny_tokenizer():
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    token_map = compressed_token_map(*vocabulary_texts(tokenizer))
    assert len(token_map) == 512 and len(set(token_map)) == max(token_map) + 1 == 464
    ids = tokenizer.token_to_id
    for k in range(64, 96):
        assert token_map[ids(f"T{k}")] == token_map[ids(f"t{k}")]
    for k in range(96, 112):
        assert token_map[ids(f"ｔ{k}")] == token_map[ids(f"t{k}")]
    assert token_map == [tiny_compressed(i) for i in range(512)]


def test_token_map_normalizer_rules():
    decoded = ["The", " the", "THE\n", "café", "cafe\u0301", "ﬁ", " ", "  ", "\t\n", "",
               "\ufffd", "\ufffd", "Ａ"]
    raw = ["The", "Ġthe", "THEĊ", "café", "café", "ﬁ", "Ġ", "ĠĠ", "ĉĊ", "", "<0xE2>", "<0xE3>",
           "Ａ"]
    # the, the, the; cafe, cafe; fi; " " thrice (one space is kept); ""; two raw keys; a
    assert compressed_token_map(decoded, raw) == [0, 0, 0, 1, 1, 2, 3, 3, 3, 4, 5, 6, 7]


def test_hash_map_size_is_checked(geometry):
    with pytest.raises(ValueError, match="engram_compressed_vocab_size is 464"):
        EngramHash(geometry, list(range(463)))


def whole_rows(engram_hash, compressed):
    return engram_hash.rows(ngram_windows(compressed, engram_hash.start_history()))


def test_every_chunk_split_equals_the_whole(engram_hash):
    ids = torch.tensor([0, 448, 64, 2, 480, 96, 511, 17, 300])
    compressed = engram_hash.compress(ids)
    whole = whole_rows(engram_hash, compressed)
    for cuts in itertools.product((False, True), repeat=len(ids) - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [len(ids)]
        history, parts = engram_hash.start_history(), []
        for start, end in itertools.pairwise(bounds):
            parts.append(engram_hash.rows(ngram_windows(compressed[start:end], history)))
            history = next_history(history, compressed[start:end])
        assert torch.equal(torch.cat(parts), whole), bounds
        assert history.tolist() == compressed[-3:].tolist()


def test_rows_fall_in_their_own_range(engram_hash, geometry):
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 464, (2000, 4), generator=generator)
    windows = torch.cat([windows, torch.full((1, 4), 463), torch.zeros(1, 4, dtype=torch.long)])
    rows = engram_hash.rows(windows)                                     # [T, 2, 12]
    for layer, primes in enumerate(PRIMES):
        offset = 0
        for column, prime in enumerate(primes):
            got = rows[:, layer, column]
            assert offset <= got.min() and got.max() < offset + prime
            offset += prime
        assert offset == geometry.engram_num_embeddings[layer]


def e4m3_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 7
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** -6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def test_lookup_dequantizes_exactly():
    codes = [0x38, 0xB8, 0x40, 0x7E, 0x01, 0x08, 0x39, 0x00]      # 1 -1 2 448 2^-9 2^-6 1.125 0
    assert [e4m3_value(c) for c in codes] == [1, -1, 2, 448, 2 ** -9, 2 ** -6, 1.125, 0]
    table = torch.tensor([[codes[(r + j) % 8] for j in range(64)] for r in range(2)],
                         dtype=torch.uint8)
    exponents = [[130, 100], [127, 0]]                          # 8, 2^-27; 1, 2^-127
    scale = torch.tensor(exponents, dtype=torch.uint8)
    rows = torch.tensor([[0, 1], [1, 1], [1, 0]])
    expected = torch.tensor([[e4m3_value(int(table[r, j])) * 2.0 ** (exponents[r][j // 32] - 127)
                              for r in row for j in range(64)] for row in rows.tolist()],
                            dtype=torch.float64)
    as_stored = (table.view(torch.float8_e4m3fn), scale.view(torch.float8_e8m0fnu))
    for data, scales in (as_stored, (table.view(torch.float8_e4m3fn), scale)):
        got = lookup(data, scales, rows)
        assert got.dtype == torch.float32 and got.shape == (3, 128)
        assert torch.equal(got.double(), expected)


def reference_engram(x, ids, layer_index, tensors, layer):
    """add_engram written out: hashes over Python ints, dequantization per element,
    the gate per token and copy, in float64."""
    prefix = f"layers.{layer}.engram."
    table = tensors[prefix + "embed.weight"].view(torch.uint8)
    scale = tensors[prefix + "embed.scale"].view(torch.uint8)
    primes, multipliers = PRIMES[layer_index], MULTIPLIERS[layer_index]
    compressed = [tiny_compressed(i) for i in ids]
    e = torch.zeros(len(ids), 12 * 32, dtype=torch.float64)
    for p in range(len(ids)):
        back = [compressed[p - k] if p - k >= 0 else PAD for k in range(4)]
        value, offset = back[0] * multipliers[0], 0
        for n in range(2, 5):
            value ^= back[n - 1] * multipliers[n - 1]
            for h in range(4):
                column = (n - 2) * 4 + h
                row = value % primes[column] + offset
                offset += primes[column]
                for j in range(32):
                    e[p, column * 32 + j] = (e4m3_value(int(table[row, j]))
                                             * 2.0 ** (int(scale[row, j // 32]) - 127))
    kv = e @ tensors[prefix + "wkv.weight"].double().T
    gate_weight = (tensors[prefix + "q_weight"].double() * tensors[prefix + "k_weight"].double())
    hc, d = x.shape[1:]
    out = x.double().clone()
    for t in range(len(ids)):
        value = kv[t, hc * d:]
        for c in range(hc):
            xc, key = x[t, c].double(), kv[t, c * d:(c + 1) * d]
            dot = float((xc * gate_weight[c] * key).sum())
            dot /= math.sqrt(float(xc.square().mean()) + CONFIG["norm_eps"])
            dot /= math.sqrt(float(key.square().mean()) + CONFIG["norm_eps"]) * math.sqrt(d)
            signed = math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)
            out[t, c] += value / (1 + math.exp(-signed))
    return out


def test_engram_matches_a_straightforward_computation(engram_hash):
    checkpoint = SafetensorsFile(FIXTURE / "model.safetensors")
    tensors = {name: checkpoint.read(name) for name in checkpoint.keys()
               if ".engram." in name or name == "embed.weight"}
    ids = [0, 5, 448, 64, 480, 96, 300, 2, 511, 17]
    generator = torch.Generator().manual_seed(1)
    embedded = tensors["embed.weight"].float()[ids].unsqueeze(1)          # [T, 1, d]
    x = embedded * (1 + 0.5 * torch.randn(len(ids), 4, 1, generator=generator))
    rows = whole_rows(engram_hash, engram_hash.compress(torch.tensor(ids)))
    for layer_index, layer in enumerate(CONFIG["engram_layer_ids"]):
        weights = EngramWeights.from_checkpoint(tensors, layer)
        got = add_engram(x, rows[:, layer_index], weights, CONFIG["norm_eps"])
        expected = reference_engram(x, ids, layer_index, tensors, layer)
        assert (expected - x.double()).abs().max() > 1e-2       # Engram moves the streams
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
