"""DeepSeek V4.1's Engram memory: n-gram hashed table rows gated into the residual streams.

At the start of each Engram layer, before its block:

    compressed ids   the token ids through a map that folds spellings which normalize
                     alike (" The", "the", "ＴＨＥ") onto one id             [T]
    windows          window[p, k] = compressed id at p - k, pad before the start [T, N]
    rows             per n = 2..N and head h: the multiply-XOR hash of the n-gram ending
                     at p, mod its own prime, plus that prime's offset in the table
                                                                        [T, L, (N-1)*H]
    e                the rows looked up (fp8 e4m3 x e8m0 per 32), concatenated
                                                                        [T, (N-1)*H*hd]
    key, value       e @ wkv, split into hc keys and one value          [T, hc, d], [T, d]
    x_c             += sigmoid(signed_sqrt(<x_c, key_c> normed)) * value   per copy c

A hash depends on the tokens and the start of the sequence only, so the one piece of
per-request state is the last N-1 compressed ids (`next_history`): a chunk hashed with
the history carried from the chunks before it gives the rows of the whole sequence.
Image-span ("dead") tokens of the official code do not occur in text serving.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from contract.engram_primes import engram_primes

SCALE_GROUP = 32        # table values per e8m0 scale
SEED_STRIDE = 10007     # layer L's multipliers come from numpy default_rng(10007 * L)
MIN_DOT = 1e-6          # the gate's |dot| floor: sqrt(1e-6) = 1e-3 keeps the sign of 0


@dataclass(frozen=True)
class EngramGeometry:
    """The Engram keys of the model config (fields named as the config's)."""

    engram_layer_ids: tuple[int, ...]        # layers that add Engram before their block
    engram_num_embeddings: tuple[int, ...]   # table rows per Engram layer (= sum of its primes)
    engram_max_ngram_size: int               # N: n-grams 2..N
    engram_vocab_size: int                   # the prime search starts above this - 1
    engram_n_heads: int                      # H: hashes per n-gram size
    engram_head_dim: int                     # hd: width of one table row
    engram_pad_token_id: int                 # raw token id that fills missing history
    engram_compressed_vocab_size: int        # size the token map must have

    def __post_init__(self):
        if len(self.engram_layer_ids) != len(self.engram_num_embeddings):
            raise ValueError(f"engram_layer_ids {self.engram_layer_ids} and engram_num_"
                             f"embeddings {self.engram_num_embeddings} differ in length")
        if self.engram_max_ngram_size < 2:
            raise ValueError(f"engram_max_ngram_size {self.engram_max_ngram_size} < 2")
        if self.engram_head_dim % SCALE_GROUP:
            raise ValueError(f"engram_head_dim {self.engram_head_dim} is not a multiple "
                             f"of {SCALE_GROUP}")
        for layer, rows, primes in zip(self.engram_layer_ids, self.engram_num_embeddings,
                                       self.primes):
            if sum(primes) != rows:
                raise ValueError(f"Engram layer {layer}: engram_num_embeddings {rows} is not "
                                 f"the sum of its primes ({sum(primes)})")

    @classmethod
    def from_config(cls, config: Mapping) -> EngramGeometry | None:
        """From a flat config (inference/config.json or the HF text_config, which spells
        the pad engram_pad_token_id where the other says engram_pad_id); None without
        Engram layers."""
        if not config.get("engram_layer_ids"):
            return None
        pad = config.get("engram_pad_token_id", config.get("engram_pad_id"))
        return cls(tuple(config["engram_layer_ids"]), tuple(config["engram_num_embeddings"]),
                   config["engram_max_ngram_size"], config["engram_vocab_size"],
                   config["engram_n_heads"], config["engram_head_dim"], pad,
                   config["engram_compressed_vocab_size"])

    @property
    def rows_per_token(self) -> int:
        """(N-1)*H: rows one token reads from each Engram layer's table."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    @cached_property
    def primes(self) -> tuple[tuple[int, ...], ...]:
        """Per Engram layer, the modulus of column c = (n-2)*H + h (contract/engram_primes.py:
        drawn in order (layer, n, head) from one pool, none repeated)."""
        return tuple(map(tuple, engram_primes(self.engram_vocab_size, self.engram_n_heads,
                                              self.engram_max_ngram_size,
                                              len(self.engram_layer_ids))))

    def multipliers(self) -> np.ndarray:
        """[layers, N] int64, odd; element k multiplies the id k tokens back. Bounded so
        that id * multiplier < 2^63 for every compressed id."""
        bound = max(1, np.iinfo(np.int64).max // self.engram_compressed_vocab_size // 2)
        return np.stack([
            np.random.default_rng(SEED_STRIDE * layer).integers(
                0, bound, size=self.engram_max_ngram_size, dtype=np.int64) * 2 + 1
            for layer in self.engram_layer_ids])


def _normalizer():
    """The key a token's text is folded by, in this exact order. A text that is exactly
    one space is protected (U+E000 while Strip runs) so it does not merge with ""."""
    from tokenizers import Regex, normalizers
    sentinel = "\ue000"
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(),
        normalizers.Lowercase(), normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), sentinel), normalizers.Strip(),
        normalizers.Replace(sentinel, " ")])


def compressed_token_map(decoded: Sequence[str], raw: Sequence[str]) -> list[int]:
    """The compressed id of each token id, from each id's text decoded alone (`decoded`)
    and its vocabulary string (`raw`). The key is the normalized text (the text itself
    if that is empty), or the raw string where the text holds U+FFFD (a partial UTF-8
    token); keys get ids 0, 1, ... in order of first appearance."""
    normalize = _normalizer().normalize_str
    keys: dict[str, int] = {}
    return [keys.setdefault(token if "\ufffd" in text else (normalize(text) or text), len(keys))
            for text, token in zip(decoded, raw, strict=True)]


def vocabulary_texts(tokenizer) -> tuple[list[str], list[str]]:
    """(decoded, raw) of every id of a `tokenizers.Tokenizer`, added tokens included:
    each id decoded alone, special tokens kept, as the raw Rust tokenizer does."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    decoded = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return decoded, [tokenizer.id_to_token(i) or "" for i in range(size)]


class EngramHash:
    """The token map and hash constants of a model's Engram layers, on one device.

    Built once at load. `rows` hashes every Engram layer at once, so a token is hashed
    once per forward whatever the number of layers."""

    def __init__(self, geometry: EngramGeometry, token_map: Sequence[int], vocab_size: int = 0,
                 device: torch.device | str = "cpu"):
        """token_map: compressed id per tokenizer id. Ids from len(token_map) up to
        vocab_size (the model's, which may exceed the tokenizer's) map to the pad's
        compressed id; the official code has no entry for them."""
        size = max(token_map, default=-1) + 1
        if size != geometry.engram_compressed_vocab_size:
            raise ValueError(f"the compressed token map has {size} entries, the config's "
                             f"engram_compressed_vocab_size is "
                             f"{geometry.engram_compressed_vocab_size}")
        self.geometry = geometry
        self.pad = token_map[geometry.engram_pad_token_id]
        padded = list(token_map) + [self.pad] * max(0, vocab_size - len(token_map))
        n, heads = geometry.engram_max_ngram_size, geometry.engram_n_heads
        primes = np.array(geometry.primes, dtype=np.int64)                  # [L, (N-1)*H]
        offsets = np.cumsum(primes, axis=1) - primes                        # exclusive sums
        self.token_map = torch.tensor(padded, dtype=torch.int64, device=device)           # [V]
        self.multipliers = torch.from_numpy(geometry.multipliers()).to(device)            # [L, N]
        self.primes = torch.from_numpy(primes).view(-1, n - 1, heads).to(device)  # [L, N-1, H]
        self.offsets = torch.from_numpy(offsets).to(device)                       # [L, (N-1)*H]

    @classmethod
    def from_tokenizer_file(cls, geometry: EngramGeometry, path: str | Path,
                            vocab_size: int = 0, device: torch.device | str = "cpu") -> EngramHash:
        """From a tokenizer.json (the checkpoint's)."""
        from tokenizers import Tokenizer
        texts = vocabulary_texts(Tokenizer.from_file(str(path)))
        return cls(geometry, compressed_token_map(*texts), vocab_size, device)

    def compress(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> compressed ids [...]."""
        return self.token_map[ids]

    def start_history(self) -> torch.Tensor:
        """The history [N-1] before a sequence's first token: all pad."""
        n = self.geometry.engram_max_ngram_size
        return torch.full((n - 1,), self.pad, dtype=torch.int64, device=self.token_map.device)

    def rows(self, windows: torch.Tensor) -> torch.Tensor:
        """windows [T, N] (`ngram_windows`) -> table row ids [T, L, (N-1)*H], column
        (n-2)*H + h of layer l within [offset, offset + prime) of (n, h)."""
        # t < compressed vocab and m < 2^63 / compressed vocab: the products stay int64
        products = windows.unsqueeze(1) * self.multipliers                  # [T, L, N]
        rolling, columns = products[..., 0], []
        for n in range(1, windows.shape[-1]):
            rolling = rolling ^ products[..., n]                            # the (n+1)-gram
            columns.append(rolling.unsqueeze(-1) % self.primes[:, n - 1])   # [T, L, H]
        return torch.cat(columns, -1) + self.offsets


def ngram_windows(compressed: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """compressed [T] of one sequence's consecutive tokens, history [N-1] the compressed
    ids of the N-1 tokens before them, oldest first (pad where before the start)
    -> windows [T, N], windows[p, k] = compressed id k tokens before token p."""
    n = history.shape[0] + 1
    return torch.cat([history, compressed]).unfold(0, n, 1).flip(-1)


def next_history(history: torch.Tensor, compressed: torch.Tensor) -> torch.Tensor:
    """The history [N-1] after the tokens `compressed` [T]."""
    return torch.cat([history, compressed])[-history.shape[0]:]


@dataclass(frozen=True)
class EngramWeights:
    """One Engram layer's tensors, as the checkpoint stores them."""

    table: torch.Tensor         # [rows, hd] float8_e4m3fn
    scale: torch.Tensor         # [rows, hd/32] float8_e8m0fnu (or its uint8 exponents)
    wkv: torch.Tensor           # [(hc+1)*d, (N-1)*H*hd], in the compute dtype
    gate_weight: torch.Tensor   # [hc, d] float32: q_weight * k_weight (only the product is used)

    @classmethod
    def from_checkpoint(cls, tensors: Mapping[str, torch.Tensor], layer: int,
                        dtype: torch.dtype = torch.float32) -> EngramWeights:
        """From the release names layers.{layer}.engram.*; wkv stored unquantized."""
        p = f"layers.{layer}.engram."
        gate = tensors[p + "q_weight"].float() * tensors[p + "k_weight"].float()
        return cls(tensors[p + "embed.weight"], tensors[p + "embed.scale"],
                   tensors[p + "wkv.weight"].to(dtype), gate)


def lookup(table: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """rows [T, R] -> the rows dequantized and concatenated [T, R*hd]. An e4m3 value times
    a power of two is exact in float32 (and then in bfloat16, which holds its 4 significant
    bits, for products of 2^-126 and up)."""
    codes = table.view(torch.uint8)[rows].view(torch.float8_e4m3fn)      # [T, R, hd]
    exponents = scale.view(torch.uint8)[rows].view(torch.float8_e8m0fnu)  # [T, R, hd/32]
    values = codes.float().unflatten(-1, (-1, SCALE_GROUP)) * exponents.float().unsqueeze(-1)
    return values.flatten(1).to(dtype)


def add_engram(x: torch.Tensor, rows: torch.Tensor, weights: EngramWeights,
               norm_eps: float) -> torch.Tensor:
    """x [T, hc, d] the residual streams, rows [T, R] this layer's row ids -> x with each
    copy's gated value added. The gate is computed in float32, each copy normalized on
    its own (over d, not jointly over the copies)."""
    hc, d = x.shape[-2:]
    kv = F.linear(lookup(weights.table, weights.scale, rows, weights.wkv.dtype), weights.wkv)
    key, value = kv.float().split([hc * d, d], -1)
    key = key.unflatten(-1, (hc, d))                                        # [T, hc, d]
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(-1) + norm_eps) * torch.rsqrt(key.square().mean(-1)
                                                                       + norm_eps)
    dot = (xf * weights.gate_weight * key).sum(-1) * rstd * d ** -0.5       # [T, hc]
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(MIN_DOT).sqrt(), dot))
    return (xf + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(x.dtype)
