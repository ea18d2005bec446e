"""A request's first decode steps against its steady ones, per fixed K: why the adaptive
speculation policy measures no K but its best in the SETTLE steps after a prefill
(AdaptiveSpeculation._timed). Prints figures; asserts nothing.

    .venv/bin/python bench/first_steps.py [--speculation 0,2] [--concurrency 1]
                                          [--rounds 4] [--first 8]

Each round runs `concurrency` held-out prompts of 256 tokens to 256 generated (greedy,
compiled backend, one engine per K, the engines in turn); each decode step's seconds as
the engine reports them to its policy. Per K it prints the median over rounds of each of
the `first` decode steps after the prefill, as a ratio to the median of the steps after
them (1.30: 30% dearer than a steady step).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import offline  # noqa: E402
from runtime.core.speculation import Speculation  # noqa: E402


class Timed(Speculation):
    """The fixed policy, keeping each decode step's seconds (None: it also prefilled)."""

    def __init__(self, k: int):
        super().__init__(k)
        self.seconds: list[float | None] = []

    def observe(self, k, rows, seconds, drafts, twin=False) -> None:
        self.seconds.append(seconds)


def first_steps(engine, model: Path, concurrency: int, first: int) -> list[float]:
    """One round: each of the first decode steps' seconds over the steady steps' median."""
    policy = engine.scheduler.speculation = Timed(engine.scheduler.speculation.k)
    batch = offline.prompts(concurrency, 256, model)
    offline.decode_row(engine, batch, [256] * concurrency, concurrency)
    timed = [s for s in policy.seconds if s is not None]
    steady = statistics.median(timed[first:])
    return [s / steady for s in timed[:first]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--speculation", default="0,2")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--first", type=int, default=8)
    args = parser.parse_args()
    model = Path(args.model)
    spec = types.SimpleNamespace(spec="tiny", model=model, device=None)
    ks = [int(k) for k in args.speculation.split(",")]
    engines = {k: offline.build(spec, "compiled", k) for k in ks}
    runs: dict[int, list[list[float]]] = {k: [] for k in ks}
    for _ in range(args.rounds):
        for k, engine in engines.items():
            runs[k].append(first_steps(engine, model, args.concurrency, args.first))
    print("| K | " + " | ".join(f"step {i + 1}" for i in range(args.first)) + " |")
    print("|---|" + "---|" * args.first)
    for k, rounds in runs.items():
        medians = [statistics.median(r[i] for r in rounds) for i in range(args.first)]
        print(f"| {k} | " + " | ".join(f"{m:.2f}" for m in medians) + " |")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
