"""Where a concurrency-1 decode step of the compiled backend spends its time, and the
fastest step one compiled program per launch could reach. Prints figures; asserts nothing.

    .venv/bin/python bench/decode_floor.py [--spec tiny] [--model DIR] [--prompt-len 256]
                                           [--max-tokens 300]

One engine (MTP off, prefix caching off) generates `--max-tokens` tokens for one prompt
twice. The first run is timed as bench/offline.py times it: the engine's step, and within
it the kernel launch. The second runs under cProfile, for the one thing it measures
without distortion: the seconds spent inside the C++ entry points of the compiled graphs
(inductor's `inductor_entry_cpp`: the graph's own kernels, its OpenMP regions and the
extern calls it makes from C++; not the custom ops it calls back into Python, which
cProfile counts as their own functions) and how many calls a step makes. cProfile
inflates Python, so every other figure comes from the first run.

    step ms             the engine's decode step (schedule, launch, sample, output)
    launch ms           the kernel launch within it (graphs, and the glue between them)
    graph calls/step    compiled graph calls a step makes
    graph C++ ms        the graphs' C++ bodies per step
    glue ms             launch - graph C++: the Python around and between the graphs and
                        the custom ops' Python
    host ms             step - launch: the engine's own work outside the launch
    floor tok/s         1000 / (graph C++ + host): a step whose launch is one program
                        with no Python in it, the engine's host work unchanged
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.args import bench_parser  # noqa: E402
from bench.offline import decode_row, prompts  # noqa: E402
from runtime.core.config import EngineConfig  # noqa: E402
from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.engine.engine import Engine  # noqa: E402

ENTRY = "inductor_entry_cpp"


def graph_seconds(stats: pstats.Stats) -> tuple[float, int]:
    """(seconds inside the compiled graphs' C++ entry points, their calls)."""
    seconds, calls = 0.0, 0
    for (_, _, name), (_, ncalls, tottime, _, _) in stats.stats.items():
        if ENTRY in name:
            seconds, calls = seconds + tottime, calls + ncalls
    return seconds, calls


def main() -> None:
    args = bench_parser(__doc__, max_tokens=300).parse_args()
    engine = Engine.build(EngineConfig(spec=args.spec, model=args.model,
                                       num_speculative_tokens=0, backend="compiled",
                                       enable_prefix_caching=False))
    engine.warmup()
    batch = prompts(1, args.prompt_len, args.model)
    timed = max((decode_row(engine, batch, args.max_tokens) for _ in range(3)),
                key=lambda r: r["tok/s"])
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    engine.generate(batch, params)
    profile.disable()
    profiled = time.perf_counter() - start
    cpp, calls = graph_seconds(pstats.Stats(profile))
    steps = args.max_tokens               # one decode step a token (the first: prefill)
    cpp_ms = 1e3 * cpp / steps
    host = timed["step"] - timed["kernel"]
    print(f"{args.spec}, {args.prompt_len}-token prompt, {args.max_tokens} tokens at "
          f"concurrency 1 (profiled run {profiled:.2f} s)")
    print("| tok/s | step ms | launch ms | graph calls/step | graph C++ ms | glue ms | "
          "host ms | floor tok/s |\n|---|---|---|---|---|---|---|---|")
    print(f"| {timed['tok/s']:.1f} | {timed['step']:.2f} | {timed['kernel']:.2f} | "
          f"{calls / steps:.1f} | {cpp_ms:.2f} | {timed['kernel'] - cpp_ms:.2f} | "
          f"{host:.2f} | {1e3 / (cpp_ms + host):.0f} |")


if __name__ == "__main__":
    main()
