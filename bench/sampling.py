"""What a launch's sampling costs on the host and the device at V4's vocabulary: building
its rows' parameters (RowParams) when some rows carry a full-vocabulary logit_bias, and
sampling them (bias, penalties, top-k/top-p, a draw). Prints figures; asserts nothing.

    .venv/bin/python bench/sampling.py [--rows 64] [--biased 8] [--vocab 129280]
                                       [--device cpu] [--against REV]

--against REV times REV's row builder beside today's, on the same parameters (REV's
batch_sampler.py, wherever REV kept it, read with `git show`: fb7270f built the bias rows
of every launch in a Python loop).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.sampling import batch_sampler  # noqa: E402
from runtime.sampling.sampling_state import SamplingState  # noqa: E402

# Where the batch sampler has lived, newest first.
SAMPLER_PATHS = ("runtime/sampling/batch_sampler.py", "runtime/device/batch_sampler.py",
                 "runtime/batch_sampler.py")

# Modules an old batch sampler imports, by their old name -> where they are now.
MOVED = {"runtime.sampling_params": "runtime.core.sampling_params",
         "runtime.sampling_state": "runtime.sampling.sampling_state"}


def timed(fn, reps: int, device: torch.device) -> float:
    """Milliseconds per call, after one call to warm up."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def launch(rows: int, biased: int, vocab: int) -> list[SamplingParams]:
    bias = tuple((t, (t % 7 - 3) / 2) for t in range(vocab))
    return [SamplingParams(temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1,
                           logit_bias=bias if i < biased else ()) for i in range(rows)]


def old_builder(rev: str, device: torch.device):
    """REV's RowParamsBuilder (None if REV has none)."""
    source = next(done.stdout for path in SAMPLER_PATHS
                  if (done := subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO,
                                             capture_output=True, text=True)).returncode == 0)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    for old, new in MOVED.items():            # REV's imports, at today's paths
        sys.modules.setdefault(old, importlib.import_module(new))
    spec = importlib.util.spec_from_file_location("old_batch_sampler", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    builder = getattr(module, "RowParamsBuilder", None)
    return builder(device) if builder else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--biased", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=129280)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--against", default=None, metavar="REV")
    args = parser.parse_args()
    device = torch.device(args.device)
    params = launch(args.rows, args.biased, args.vocab)
    seeds, counters, states = list(range(args.rows)), [3] * args.rows, list(range(args.rows))
    state = SamplingState(args.rows, args.vocab, device)

    def admit_all() -> None:
        for slot, p in enumerate(params):
            state.admit(slot, [1, 2, 3], [4, 5], p, seeds[slot])

    admitted = timed(admit_all, 1, device)   # the tables' pages are touched once, first
    at, done = np.array(states), np.array(counters)
    rows = state.rows(at, done)
    logits = torch.randn(args.rows, args.vocab, device=device)
    counts, seen = state.penalties(rows)
    print(f"{args.rows} rows, {args.biased} with a {args.vocab}-entry logit_bias, on {device}")
    print(f"  admit every row (once per request)  {admitted:8.1f} ms")
    build = timed(lambda: state.rows(at, done), args.reps, device)
    draw = timed(lambda: batch_sampler.sample(logits, rows, counts, seen), args.reps, device)
    print(f"  row parameters (per launch)         {build:8.1f} ms")
    print(f"  sample (per launch)                 {draw:8.1f} ms")
    if args.against:
        builder = old_builder(args.against, device)
        if builder is None:
            print(f"  {args.against}: no RowParamsBuilder to compare")
            return
        old = timed(lambda: builder.build(params, seeds, counters, states), args.reps, device)
        print(f"  row parameters at {args.against} (per launch)  {old:8.1f} ms")


if __name__ == "__main__":
    main()
