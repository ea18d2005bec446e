"""What a grammar mask costs: offline decode throughput of the tiny spec's compiled engine
at one concurrency, every request unconstrained or every request under a constraint,
MTP off and on, the rows interleaved over several rounds (this machine drifts) and each
compared with the unconstrained run of its own round. Prints figures; asserts nothing.

    .venv/bin/python bench/structured.py [--model DIR] [--concurrency 8] [--max-tokens 192]
                                         [--rounds 3]

Constraints:
    allow-all   a regex every text matches: the same tokens as unconstrained, so the
                difference is the mask's whole cost (matcher, mask copy, the masked fill,
                and with MTP the draft's own mask)
    json        a JSON array of strings that never has to end: a realistic grammar, whose
                text (and MTP acceptance) differs from the unconstrained one
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.offline import build, prompts  # noqa: E402
from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.text.grammar import StructuredOutputs  # noqa: E402
from server.cli.spec_check import default_model  # noqa: E402

CONSTRAINTS = {
    "none": None,
    "allow-all": StructuredOutputs(regex=r"(?s:.*)"),
    "json": StructuredOutputs(json=json.dumps(
        {"type": "array", "items": {"type": "string", "maxLength": 40}})),
}


def run(engine, batch: list[list[int]], max_tokens: int,
        constraint: StructuredOutputs | None) -> tuple[float, list[list[int]]]:
    """(output tokens per second, the outputs) of one generate over the batch."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            structured=constraint)
    start = time.perf_counter()
    outputs = engine.generate(batch, params)
    seconds = time.perf_counter() - start
    return sum(len(o.output_ids) for o in outputs) / seconds, [o.output_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model("tiny"))
    parser.add_argument("--spec", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batch = prompts(args.concurrency, args.prompt_len, args.model)
    print(f"# concurrency {args.concurrency}, {args.prompt_len}-token prompts, "
          f"{args.max_tokens} tokens each, greedy, {args.rounds} rounds")
    print(f"{'MTP':>4} {'constraint':>10} {'tok/s':>8} {'vs none':>8} {'same tokens':>11}")
    for k in (0, 1):
        engine = build(args, "compiled", k)
        for constraint in CONSTRAINTS.values():          # first use: compile, build matchers
            run(engine, batch[:2], 8, constraint)
        rates: dict[str, list[float]] = {name: [] for name in CONSTRAINTS}
        ratios: dict[str, list[float]] = {name: [] for name in CONSTRAINTS}
        same: dict[str, bool] = {}
        for _ in range(args.rounds):
            base, plain = run(engine, batch, args.max_tokens, None)
            for name, constraint in CONSTRAINTS.items():
                rate, outputs = (base, plain) if constraint is None else \
                    run(engine, batch, args.max_tokens, constraint)
                rates[name].append(rate)
                ratios[name].append(rate / base)
                same[name] = outputs == plain
        for name in CONSTRAINTS:
            print(f"{'on' if k else 'off':>4} {name:>10} {statistics.median(rates[name]):8.1f} "
                  f"{statistics.median(ratios[name]):8.3f} {str(same[name]):>11}", flush=True)


if __name__ == "__main__":
    main()
