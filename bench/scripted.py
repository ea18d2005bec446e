"""A speculation policy whose K per decode step is scripted, for benches that measure
what the adaptive policy's choices cost (bench/twin_warm.py, bench/switch_cost.py)."""
from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

from bench import offline
from runtime.core.speculation import AdaptiveSpeculation


@dataclass
class Step:
    """One decode step as the engine reported it."""

    place: int              # its index in the script's cycle
    k: int
    twin: bool              # K=0 keeping the MTP slots
    seconds: float | None   # None: the step also prefilled
    rows: int
    kept: int               # drafts kept, all rows
    first_kept: int         # rows that kept their first draft


class Scripted(AdaptiveSpeculation):
    """K per step from a cycle of `pattern` (-1: K=0 keeping the slots); every step
    reported is kept in `steps`. The adaptive policy's bookkeeping still runs (each
    request's acceptance, Acceptance.behind), so drafts are counted as it counts them."""

    def __init__(self, max_k: int, pattern: list[int]):
        super().__init__(max_k)
        self.pattern, self.chosen_at = pattern, 0
        self.steps: list[Step] = []

    def choose(self, rows, left=None) -> int:
        k = self.pattern[self.chosen_at % len(self.pattern)]
        self.chosen_at += 1
        self.keep_slots = k < 0
        return max(k, 0)

    def observe(self, k, rows, seconds, drafts, twin=False) -> None:
        self.steps.append(Step((self.chosen_at - 1) % len(self.pattern), k, twin, seconds,
                               rows, sum(a for _, a in drafts),
                               sum(a >= 1 for _, a in drafts)))
        super().observe(k, rows, seconds, drafts, twin)


def run(model: Path, max_k: int, pattern: list[int], concurrency: int,
        rounds: int) -> list[Step]:
    """The steps of `rounds` batches of `concurrency` held-out prompts, 256 tokens to 256
    generated (greedy, compiled backend), K scripted by `pattern`."""
    engine = offline.build(types.SimpleNamespace(spec="tiny", model=model, device=None),
                           "compiled", max_k, policy="adaptive")
    policy = engine.scheduler.speculation = Scripted(max_k, pattern)
    for _ in range(rounds):
        batch = offline.prompts(concurrency, 256, model)
        offline.decode_row(engine, batch, [256] * concurrency, concurrency)
    engine.close()
    return policy.steps
