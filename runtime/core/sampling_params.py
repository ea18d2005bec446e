"""Per-request sampling parameters, validated at the edge (vLLM's names and meanings).

Every number is checked for its domain here, once, whoever builds the params (the HTTP
server, `v4serve generate`, a library caller): non-finite floats never reach a sampler.
Checks that need the model (token ids within the vocabulary) live in Engine.validate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from runtime.text.grammar import StructuredOutputs

SAMPLING_EPS = 1e-5        # a temperature below this is greedy (vLLM's rule)
INT64_MAX = 2**63 - 1     # integers travel as int64 (msgpack to the engine core, tensors)
SEED_MIN, SEED_MAX = -(2**63), INT64_MAX      # a signed 64-bit seed, as vLLM accepts
MAX_LOGIT_BIAS = 100.0     # OpenAI's range for logit_bias values
MAX_CACHE_SALT = 1024      # characters: a salt is hashed on the engine's thread, per request


class InvalidParam(ValueError):
    """A parameter outside its domain; `param` names the field as the API spells it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0          # below SAMPLING_EPS = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 or -1 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None       # top-n log-probs per generated token
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias) added to the logits
    structured: StructuredOutputs | None = None       # what the output must match
    # vLLM's cache_salt: requests share prefix-cache entries only with requests of the same
    # salt (None: with the other unsalted ones); runtime/core/prefix_cache.py keys by it
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        for param, message in self._problems():
            raise InvalidParam(param, message)

    def _problems(self):
        """(field, message) for every value outside its domain, in field order."""
        if not _int_in(self.max_tokens, 1):
            yield "max_tokens", (f"max_tokens must be an integer in [1, {INT64_MAX}], got "
                                 f"{self.max_tokens}")
        for name, low, high, low_open in _FLOAT_RANGES:
            value = getattr(self, name)
            if not _in_range(value, low, high, low_open):
                yield name, f"{name} must be {_describe(low, high, low_open)}, got {value}"
        if not _int_in(self.top_k, -1):
            yield "top_k", (f"top_k must be -1 or 0 (off) or an integer in [1, {INT64_MAX}], "
                            f"got {self.top_k}")
        if self.seed is not None and not _int_in(self.seed, SEED_MIN):
            yield "seed", f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {self.seed}"
        if any(not isinstance(s, str) or not s for s in self.stop):
            yield "stop", "stop must hold non-empty strings only"
        if not all(_int_in(t, 0) for t in self.stop_token_ids):
            yield "stop_token_ids", "stop_token_ids must hold non-negative token ids"
        if self.logprobs is not None and not _int_in(self.logprobs, 0):
            yield "logprobs", f"logprobs must be a non-negative integer, got {self.logprobs}"
        yield from _logit_bias_problems(self.logit_bias)
        if (problem := cache_salt_problem(self.cache_salt)) is not None:
            yield "cache_salt", problem
        if self.structured is not None and not isinstance(self.structured, StructuredOutputs):
            yield "structured_outputs", "structured must be a StructuredOutputs"

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @cached_property
    def stop_token_set(self) -> frozenset[int]:
        """stop_token_ids as a set: the scheduler looks up every generated token."""
        return frozenset(self.stop_token_ids)

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


# (field, low, high, low bound excluded): the domain of every float parameter
_FLOAT_RANGES = (
    ("temperature", 0.0, math.inf, False),
    ("top_p", 0.0, 1.0, True),
    ("min_p", 0.0, 1.0, False),
    ("presence_penalty", -2.0, 2.0, False),
    ("frequency_penalty", -2.0, 2.0, False),
    ("repetition_penalty", 0.0, math.inf, True),
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value, low: int) -> bool:
    """An integer from `low` up to INT64_MAX: every integer field travels as an int64."""
    return _is_int(value) and low <= value <= INT64_MAX


def _in_range(value, low: float, high: float, low_open: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        if not math.isfinite(value):       # an int beyond a double overflows here
            return False
    except OverflowError:
        return False
    return (low < value if low_open else low <= value) and value <= high


def _describe(low: float, high: float, low_open: bool) -> str:
    if high == math.inf:
        return f"a finite number {'>' if low_open else '>='} {low:g}"
    return f"a finite number in {'(' if low_open else '['}{low:g}, {high:g}]"


def _logit_bias_problems(bias: tuple[tuple[int, float], ...]):
    seen = set()
    for token, value in bias:
        if not _int_in(token, 0):
            yield "logit_bias", f"logit_bias keys must be non-negative token ids, got {token}"
            return
        if token in seen:               # two biases for one token would add up
            yield "logit_bias", f"logit_bias gives token {token} more than once"
            return
        seen.add(token)
        if not _in_range(value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, False):
            yield "logit_bias", (f"logit_bias values must be finite numbers in "
                                 f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {value} "
                                 f"for token {token}")
            return


def cache_salt_problem(salt) -> str | None:
    """Why `salt` is not a cache_salt (vLLM's rule: a non-empty string if given), or None."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return "cache_salt must be a non-empty string"
    if len(salt) > MAX_CACHE_SALT:
        return f"cache_salt must be at most {MAX_CACHE_SALT} characters, got {len(salt)}"
    if not salt.isascii():
        try:
            salt.encode("utf-8")
        except UnicodeEncodeError:
            return "cache_salt must be valid Unicode (it holds a lone surrogate)"
    return None


GREEDY = SamplingParams(temperature=0.0)
