"""How many twin steps (K=0 that keeps the MTP slots) a drafting step needs after a run
of plain K=0 steps to draft as well as in a run of fused steps: the figure behind
AdaptiveSpeculation.WARM. Prints figures; asserts nothing.

    .venv/bin/python bench/twin_warm.py [--warm 0,2,4,8,16,40] [--concurrency 8]
                                        [--k 1] [--run 40] [--rounds 3]

Each decode step's K is scripted, in a cycle: `run` - W plain K=0 steps (the MTP slots
stay behind, the window keeps a hole over them), W twin steps, then two steps of K
drafts; and, as the baseline, K drafts on every step. Per W it prints how often the
first draft is kept in the first and the second drafting step (the policy counts only
the second after a plain step, Acceptance.behind), and a twin step's seconds over a
plain one's (medians), over `rounds` batches of `concurrency` held-out prompts, 256
tokens each, on the compiled backend.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scripted  # noqa: E402
from bench.scripted import Step  # noqa: E402


def first_kept(args, pattern: list[int]) -> tuple[dict[int, float], float | None]:
    """Per place in a run of drafting steps (1, 2 and after): the first drafts kept; and
    a twin step's seconds over a plain K=0 step's (medians; None without twins)."""
    return _tally(scripted.run(Path(args.model), args.k, pattern, args.concurrency,
                               args.rounds))


def _tally(steps: list[Step]) -> tuple[dict[int, float], float | None]:
    kept: dict[int, list[int]] = {}          # place in the run: [rows, first kept]
    seconds: dict[bool, list[float]] = {False: [], True: []}   # K=0: plain, twin
    run = 0
    for step in steps:
        run = run + 1 if step.k else 0
        if step.k:
            count = kept.setdefault(min(run, 2), [0, 0])
            count[0] += step.rows
            count[1] += step.first_kept
        elif step.seconds is not None:
            seconds[step.twin].append(step.seconds)
    plain, twin = seconds[False], seconds[True]
    ratio = statistics.median(twin) / statistics.median(plain) if twin and plain else None
    return {place: n / rows for place, (rows, n) in sorted(kept.items())}, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--warm", default="0,2,4,8,16,40")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--run", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| twin steps before | first drafts kept, 1st drafting step | 2nd | twin / plain "
          "step |\n|---|---|---|---|")
    for warm in (int(w) for w in args.warm.split(",")):
        kept, ratio = first_kept(args, [0] * (args.run - warm) + [-1] * warm + [args.k] * 2)
        print(f"| {warm} of {args.run} | {kept[1]:.3f} | {kept.get(2, float('nan')):.3f} | "
              + (f"{ratio:.2f}x |" if ratio else "- |"), flush=True)
    steady, _ = first_kept(args, [args.k])
    print(f"| K={args.k} every step | {steady[2]:.3f} (all) | | |")


if __name__ == "__main__":
    main()
