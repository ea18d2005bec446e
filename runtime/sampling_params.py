"""Per-request sampling parameters, validated at the edge (vLLM's names and meanings)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None       # top-n log-probs per generated token

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self):
        if self.max_tokens < 1:
            yield f"max_tokens must be at least 1, got {self.max_tokens}"
        if self.temperature < 0:
            yield f"temperature must be >= 0, got {self.temperature}"
        if not 0 < self.top_p <= 1:
            yield f"top_p must be in (0, 1], got {self.top_p}"
        if self.top_k < 0:
            yield f"top_k must be >= 0 (0 disables it), got {self.top_k}"
        if not 0 <= self.min_p <= 1:
            yield f"min_p must be in [0, 1], got {self.min_p}"
        if self.repetition_penalty <= 0:
            yield f"repetition_penalty must be > 0, got {self.repetition_penalty}"
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            yield "presence_penalty and frequency_penalty must be in [-2, 2]"
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            yield f"logprobs must be in [0, 20], got {self.logprobs}"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


GREEDY = SamplingParams(temperature=0.0)
