"""What a stretch of drafting steps among plain K=0 ones costs beyond its steps' own
seconds: the figure behind the adaptive policy's Batching (AdaptiveSpeculation._pick
runs the drafting probes due soon together). Prints figures; asserts nothing.

    .venv/bin/python bench/switch_cost.py [--k 1,2,3] [--concurrency 1] [--run 40]
                                          [--warm 4] [--rounds 2]

Each decode step's K is scripted, in a cycle of `run` steps: plain K=0 steps, `warm`
twin steps (K=0 keeping the MTP slots), then two steps of K drafts, as the policy
probes a K while K=0 leads. Per K it prints each step of the stretch and the three
plain steps after it as a ratio to a steady plain step (the median of the plain steps
eight or more after the stretch), then what the stretch cost: its steps' and the three
after's seconds, in steady plain steps, less the tokens each row committed in them (a
plain step commits one) - the plain steps lost - and that as a share of a request of
256 plain steps. Over `rounds` batches of `concurrency` held-out prompts, 256 tokens
each, on the compiled backend.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scripted  # noqa: E402
from bench.scripted import Step  # noqa: E402

AFTER = 3          # plain steps after the stretch counted in it
STEADY = 8         # plain steps after the stretch from which one is steady


def stretch(steps: list[Step], pattern: list[int]) -> tuple[list[float], float]:
    """Per place of the stretch and the AFTER steps after it: the median seconds over a
    steady plain step's; and the plain steps lost per stretch (the median cycle's)."""
    start = next(i for i, k in enumerate(pattern) if k)   # plain, twins, drafts, plain
    places = list(range(start, len(pattern))) + list(range(AFTER))
    steady = statistics.median(s.seconds for s in steps if s.seconds is not None
                               and STEADY <= s.place < start)
    by_place: dict[int, list[float]] = {p: [] for p in places}
    lost, cycle = [], []
    for step in steps:
        cycle = [] if step.place == start else cycle
        if step.seconds is None or step.place not in by_place:
            continue
        by_place[step.place].append(step.seconds / steady)
        cycle.append(step.seconds / steady - (step.rows + step.kept) / step.rows)
        if step.place == AFTER - 1 and len(cycle) == len(places):
            lost.append(sum(cycle))
    return [statistics.median(by_place[p]) for p in places], statistics.median(lost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--k", default="1,2,3")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--run", type=int, default=40)
    parser.add_argument("--warm", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    names = [f"twin {i + 1}" for i in range(args.warm)] + ["K 1st", "K 2nd"] \
        + [f"plain {i + 1}" for i in range(AFTER)]
    print("| K | " + " | ".join(names) + " | plain steps lost | of 256 |")
    print("|---|" + "---|" * (len(names) + 2))
    for k in ks:
        pattern = [0] * (args.run - args.warm - 2) + [-1] * args.warm + [k] * 2
        steps = scripted.run(Path(args.model), max(ks), pattern, args.concurrency,
                             args.rounds)
        ratios, lost = stretch(steps, pattern)
        print(f"| {k} | " + " | ".join(f"{r:.2f}" for r in ratios)
              + f" | {lost:.2f} | {lost / 256:.1%} |", flush=True)


if __name__ == "__main__":
    main()
