"""The cost the adaptive policy holds for each K, against what a step of that K costs
when it runs steadily, in the same rounds: how far its probes' readings are from the
steps they measure. Prints figures; asserts nothing.

    .venv/bin/python bench/policy_costs.py [--concurrency 1] [--between 64] [--rounds 3]
                                           [--deep] [--max-tokens 256] [--samples] [--excess]
                                           [--fixed-order] [--host] [--noise]

Each round runs the engines of fixed K = 0 .. the spec's largest and the adaptive one
side by side (bench/offline.py's decode_rows: one step of each in turn) on
`concurrency` held-out prompts, then, with `--between`, a batch of that many rows (the
rounds of the README's table run 1, 8 and 64 in turn, so the policy comes back to one
row from others). After each round at `concurrency` it prints, per K: the fixed
engine's steady step (the median of its decode-only steps) over fixed K=0's, the cost
the adaptive policy holds for K at that row count over the one it holds for K=0, their
ratio, and adaptive's steps of K among its decode-only steps (twins not counted).

`--excess` also prints, each round, where adaptive's time beyond K=0's goes: each of its
decode-only steps at `concurrency` rows less what fixed K=0's steps nearest in time take
for the same tokens, summed by kind of step (K=0 plain, the twin, each drafting K);
and beside it the measure's zero, fixed K=0's own steps measured the same way.

`--host` also prints, each round, the host time of the policy's choice and of its
observation of a step (the medians and means per step, in microseconds), adaptive's
against fixed K=0's: run between kernels, on the caches they left cold.

`--noise` also prints, each round, how well this machine lets a step's cost be measured:
fixed K=0's step-to-step spread at `concurrency` rows (the standard deviation of its
steps' seconds over their median), and the error of a speed read from the median of a
plain step's w steps before (the policy's Drift reads it from w = 3) as the median of the
six from it on (the standard deviation of their log ratio), for w = 1, 3, 5, 9. A probe's
sample is its seconds over such a speed: it carries that error besides its own step's.

`--samples` also prints each cost sample the policy took at `concurrency` rows in the
round: its step, K, the step's seconds over the median of the three plain K=0 steps
before it and the three after (what it cost beside them), and the sample over the cost
the policy held for K=0 then (what it recorded).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import generated  # noqa: E402
from bench import offline  # noqa: E402
from bench.args import bench_parser  # noqa: E402
from runtime.planning.admission import servable_ks  # noqa: E402


def record(engine, rows: int) -> list[tuple[int, float, float | None]]:
    """(K, seconds, the cost sample it gave over the K=0 cost held then, or None) of each
    decode-only step of `rows` rows the engine's policy is told of from now."""
    steps: list[tuple[int, float, float | None]] = []
    policy = engine.scheduler.speculation
    observe = policy.observe
    costs = getattr(policy, "costs", {})

    def samples(k: int) -> list[float]:
        cost = costs.get((k, rows.bit_length()))      # the policy's bucket of `rows`
        return list(cost.samples) if cost else []

    def recorded(k, n, seconds, drafts, twin=False):
        before = samples(k)
        observe(k, n, seconds, drafts, twin)
        if seconds is None or twin or n != rows:
            return
        after, k0 = samples(k), samples(0)
        taken = after[-1] / statistics.median(k0) if after != before and k0 else None
        steps.append((k, seconds, taken))

    policy.observe = recorded
    return steps


def timeline(engine, rows: int) -> list[tuple[float, str, float, int]]:
    """(when, kind, seconds, tokens) of each decode-only step of `rows` rows the engine's
    policy is told of from now; kind "K=k", or "twin" for a K=0 step that kept the
    MTP slots."""
    steps: list[tuple[float, str, float, int]] = []
    policy = engine.scheduler.speculation
    observe = policy.observe

    def timed(k, n, seconds, drafts, twin=False):
        observe(k, n, seconds, drafts, twin)
        if seconds is not None and n == rows:
            tokens = sum(1 + kept for _, kept in drafts) if k else n
            steps.append((time.perf_counter(), "twin" if twin else f"K={k}", seconds, tokens))

    policy.observe = timed
    return steps


def clocked(engine) -> dict[str, list[float]]:
    """The seconds of each call of the engine's policy's choose and observe from now."""
    policy = engine.scheduler.speculation
    calls: dict[str, list[float]] = {}
    for name in ("choose", "observe"):
        setattr(policy, name, _clock(getattr(policy, name), calls.setdefault(name, [])))
    return calls


def _clock(call, times: list[float]):
    """`call`, each call's seconds appended to `times`."""
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return out
    return timed


def print_host(round_: int, calls: dict[str, dict[str, list[float]]]) -> None:
    """Per engine and call: the median and mean microseconds of the round's calls."""
    for name, by_call in calls.items():
        figures = ", ".join(f"{call} {1e6 * statistics.median(t):.1f} median "
                            f"{1e6 * statistics.mean(t):.1f} mean"
                            for call, t in by_call.items())
        print(f"  round {round_}: {'fixed K=0' if name == 0 else name}'s policy, "
              f"us a step: {figures}")


def print_excess(round_: int, adaptive: list[tuple[float, str, float, int]],
                 plain: list[tuple[float, str, float, int]], rows: int) -> None:
    """Adaptive's seconds beyond what fixed K=0's steps nearest in time (seven) take for
    the same tokens, by kind of step, against fixed K=0's own seconds in the round; and
    the measure's zero: fixed K=0's own steps against the seven of its others nearest
    them (a step's seconds are skewed, a few slowed by something else, so a sum of them
    runs over the medians it is set against)."""
    excess: dict[str, float] = {}
    for when, kind, seconds, tokens in adaptive:
        excess[kind] = excess.get(kind, 0.0) + seconds - tokens / rows * _near(plain, when)
    zero = sum(step[2] - _near([s for s in plain if s is not step], step[0])
               for step in plain)
    total = sum(step[2] for step in plain)
    kinds = ", ".join(f"{kind} {1e3 * x:+.1f}" for kind, x in sorted(excess.items()))
    print(f"  round {round_}: adaptive's excess over K=0's steps, ms: {kinds}; in all "
          f"{1e3 * sum(excess.values()):+.1f} ({sum(excess.values()) / total:+.1%} of K=0's "
          f"{1e3 * total:.0f} ms); K=0's own by the same measure {1e3 * zero:+.1f} "
          f"({zero / total:+.1%})")


def print_noise(round_: int, plain: list[tuple[float, str, float, int]]) -> None:
    """Fixed K=0's step-to-step spread, and the error of a speed read from its last w
    steps as the median of its next six (see `--noise` in the module docstring)."""
    seconds = [step[2] for step in plain]
    middle = statistics.median(seconds)
    errors = []
    for w in (1, 3, 5, 9):
        logs = [math.log(statistics.median(seconds[i - w:i])
                         / statistics.median(seconds[i:i + 6]))
                for i in range(w, len(seconds) - 5)]
        errors.append(f"w={w} {statistics.pstdev(logs):.1%}")
    print(f"  round {round_}: fixed K=0's steps spread {statistics.pstdev(seconds) / middle:.1%}"
          f" of their median; a speed read from the w steps before, against the six "
          f"after: {', '.join(errors)}")


def _near(plain: list[tuple[float, str, float, int]], when: float) -> float:
    """The median seconds of the seven steps of `plain` nearest in time to `when`."""
    return statistics.median(step[2] for step in
                             sorted(plain, key=lambda step: abs(step[0] - when))[:7])


def print_samples(round_: int, steps: list[tuple[int, float, float | None]]) -> None:
    """Each sample of a round: its step against the plain K=0 steps around it, and as the
    policy recorded it (over its K=0 cost)."""
    plain = [i for i, (k, _, _) in enumerate(steps) if not k]
    for i, (k, seconds, taken) in enumerate(steps):
        if taken is None:
            continue
        near = [steps[j][1] for j in plain if j < i][-3:] + [steps[j][1] for j in plain
                                                            if j > i][:3]
        beside = seconds / statistics.median(near) if near else float("nan")
        print(f"  round {round_} step {i}: K={k}, {beside:.2f} of the plain steps beside "
              f"it, recorded {taken:.2f} of K=0's cost")


def main() -> None:
    parser = bench_parser(__doc__, max_tokens=256)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--between", type=int, default=64,
                        help="rows of the batch run between rounds (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deep", action="store_true",
                        help="the 16-layer model of specs/tiny-deep.yaml, built from --model")
    parser.add_argument("--device", default=None, help="default: the spec's")
    parser.add_argument("--excess", action="store_true",
                        help="print adaptive's time beyond K=0's steps, by kind of step")
    parser.add_argument("--fixed-order", action="store_true",
                        help="step the engines in one order every turn (K=0 .. the "
                             "largest, then adaptive), not a new one each turn")
    parser.add_argument("--host", action="store_true",
                        help="print the host time of the policy's choose and observe")
    parser.add_argument("--noise", action="store_true",
                        help="print how well this machine lets a step's cost be measured")
    parser.add_argument("--samples", action="store_true",
                        help="print each cost sample the policy took, beside its neighbours")
    args = parser.parse_args()
    if args.deep:
        from bench.deep_checkpoint import build as build_deep
        from runtime.backends.compiled.graphs import cache_dir

        args.spec = "tiny-deep"
        layers = generated.load(args.spec).architecture.CONFIG["num_hidden_layers"]
        args.model = build_deep(args.model, cache_dir() / "checkpoints" / args.spec, layers)
    most = max(servable_ks(generated.load(args.spec).contract))
    ks = list(range(most + 1))
    engines = {k: offline.build(args, "compiled", k) for k in ks}
    engines["adaptive"] = offline.build(args, "compiled", most, policy="adaptive")
    host = {name: clocked(engines[name]) for name in (0, "adaptive")}   # innermost
    steps = {name: record(engine, args.concurrency) for name, engine in engines.items()}
    times = {name: timeline(engines[name], args.concurrency) for name in (0, "adaptive")}
    policy = engines["adaptive"].scheduler.speculation
    n = args.concurrency
    print(f"spec {args.spec}, {n} rows, {args.max_tokens} tokens, {args.rounds} rounds"
          f"{f', {args.between} rows between' if args.between else ''}")
    print("| round | K | steady step / K=0's | policy's cost / K=0's | policy / steady "
          "| adaptive's steps |\n|---|---|---|---|---|---|")
    for i in range(args.rounds):
        for log in (*steps.values(), *times.values(),
                    *(t for calls in host.values() for t in calls.values())):
            log.clear()
        offline.decode_rows(engines, offline.prompts(n, args.prompt_len, args.model),
                            args.max_tokens, n, shuffled=not args.fixed_order)
        steady = {k: statistics.median(s for _, s, _ in steps[k]) for k in ks}
        chosen = {k: sum(1 for j, _, _ in steps["adaptive"] if j == k) for k in ks}
        for k in ks[1:]:
            fixed = steady[k] / steady[0]
            held = policy.cost(k, n) / policy.cost(0, n)
            print(f"| {i + 1} | {k} | {fixed:.2f} | {held:.2f} | {held / fixed:.2f} "
                  f"| {chosen[k]} of {sum(chosen.values())} |", flush=True)
        if args.samples:
            print_samples(i + 1, steps["adaptive"])
        if args.excess:
            print_excess(i + 1, times["adaptive"], times[0], n)
        if args.host:
            print_host(i + 1, host)
        if args.noise:
            print_noise(i + 1, times[0])
        if args.between:
            offline.decode_rows(engines, offline.prompts(args.between, args.prompt_len,
                                                         args.model),
                                args.max_tokens, args.between)


if __name__ == "__main__":
    main()
