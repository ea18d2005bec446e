"""How close v4serve comes to this machine's limits, every figure from one run. Prints
figures; asserts nothing.

    .venv/bin/python bench/roofline.py [--model DIR] [--dtypes float32,bfloat16]
                                       [--concurrency 1,64] [--prompt-len 256]
                                       [--max-tokens 64] [--long-prompt 16000]
                                       [--no-transformers]

The machine: its read bandwidth (the best of several sums over a 1 GiB tensor, on every
thread torch uses) and its best matmul rate per dtype (torch.mm on 2048-square operands
and on the model's widest projection at 1,024 rows).

Per compute dtype (the spec `tiny` in float32, `tiny-bf16` in bfloat16; compiled backend,
MTP off, prefix caching off):

- decode at concurrency 1: the engine's step time and the bytes a step reads (every
  main layer's dense tensors, its top-k routed experts and the head, at the dtype's
  size; the cache rows attention reads at the run's mean context), as a fraction of the
  bandwidth bound: bytes / step time / bandwidth;
- prefill of one long prompt: its useful FLOPs (every token through every main layer's
  dense tensors and top-k experts, attention QK and PV over the window and the
  compressed entries it may read, the indexer's scores; the head once) / seconds / the
  dtype's matmul peak;
- tok/s at each concurrency, against transformers' generate in float32 and in bfloat16
  measured in the same run: the ratio is against the faster of the two.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import generated  # noqa: E402
from bench.args import bench_parser  # noqa: E402
from bench.flops import step_elements  # noqa: E402
from bench.offline import decode_row, prefill_seconds, prompts, run_transformers  # noqa: E402
from contract.checkpoint_layout import expected_shapes  # noqa: E402
from contract.model_args import ModelArgs  # noqa: E402
from runtime.core.config import EngineConfig  # noqa: E402
from runtime.engine.engine import Engine  # noqa: E402

SPEC_OF = {"float32": "tiny", "bfloat16": "tiny-bf16"}


def best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second a sum over a `gib`-GiB float32 tensor reads, at best."""
    data = torch.ones(int(gib * 2**30) // 4)
    return data.numel() * 4 / best_seconds(lambda: data.sum(), repeats)


def matmul_peak(dtype: torch.dtype, widest: tuple[int, int], repeats: int = 5) -> float:
    """The best torch.mm FLOP/s of `dtype` over 2048-square operands and over 1,024 rows
    times the model's widest projection ([out, in] = `widest`)."""
    best = 0.0
    for m, k, n in ((2048, 2048, 2048), (1024, widest[1], widest[0])):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        best = max(best, 2 * m * k * n / best_seconds(lambda a=a, b=b: torch.mm(a, b), repeats))
    return best


def decode_bytes(args: ModelArgs, itemsize: int, context: int) -> int:
    """Bytes one token's decode step reads: the main layers' dense tensors and top-k
    experts and the head, and the cache rows its attention reads at `context`."""
    shapes = expected_shapes(args)
    weights = step_elements(shapes, args, range(args.n_layers)) + math.prod(shapes["head.weight"])
    cache = 0
    for layer in range(args.n_layers):
        cache += min(context, args.window) * args.head_dim
        ratio = args.ratio(layer)
        if ratio == 4:
            cache += min(args.index_topk, context // 4) * args.head_dim
            cache += context // 4 * args.index_head_dim                 # every key scored
        elif ratio:
            cache += context // ratio * args.head_dim
    return (weights + cache) * itemsize


def prefill_flops(args: ModelArgs, tokens: int) -> float:
    """Useful FLOPs of a prefill of `tokens`: the matmuls of every token through every
    main layer (dense tensors, top-k experts), attention QK and PV over the keys each
    may read, the indexer's scores, and the head once."""
    shapes = expected_shapes(args)
    pos = np.arange(1, tokens + 1, dtype=np.float64)          # keys up to and with itself
    total = 2.0 * tokens * step_elements(shapes, args, range(args.n_layers))
    for layer in range(args.n_layers):
        keys = np.minimum(pos, args.window)
        ratio = args.ratio(layer)
        if ratio == 4:
            keys = keys + np.minimum(args.index_topk, pos // 4)
            total += 2.0 * args.index_heads * args.index_head_dim * (pos // 4).sum()
        elif ratio:
            keys = keys + pos // ratio
        total += 4.0 * args.n_heads * args.head_dim * keys.sum()
    return total + 2.0 * math.prod(shapes["head.weight"])


def engine(model: Path, spec: str) -> Engine:
    built = Engine.build(EngineConfig(spec=spec, model=model, num_speculative_tokens=0,
                                      backend="compiled", enable_prefix_caching=False))
    start = time.perf_counter()
    seconds = built.warmup()
    print(f"# {spec}: {len(seconds)} graphs compiled or loaded in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return built


def transformers_rates(model: Path, dtypes: list[str], levels: list[int], prompt_len: int,
                       max_tokens: int) -> dict[tuple[str, int], float]:
    from bench.transformers_baseline import load_transformers

    hf, rates = load_transformers(model), {}
    for dtype in dtypes:
        hf = hf.to(getattr(torch, dtype))
        for n in levels:
            rates[dtype, n] = run_transformers(hf, prompts(n, prompt_len, model), max_tokens)
    return rates


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="v4serve's compute dtypes to run (transformers runs both)")
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--long-prompt", type=int, default=16000)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    dtypes, levels = args.dtypes.split(","), [int(c) for c in args.concurrency.split(",")]
    both = list(SPEC_OF)
    margs = ModelArgs.from_config(generated.load("tiny").architecture.CONFIG)
    widest = max((s for s in expected_shapes(margs).values() if len(s) == 2),
                 key=math.prod)
    bandwidth = read_bandwidth()
    peaks = {d: matmul_peak(getattr(torch, d), widest) for d in both}
    print(f"{args.model}, {torch.get_num_threads()} CPU threads; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; matmul peak "
          + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks.items()), flush=True)
    hf = {} if args.no_transformers else transformers_rates(
        args.model, both, levels, args.prompt_len, args.max_tokens)
    for n in levels:
        if hf:
            print(f"transformers generate, concurrency {n}: "
                  + ", ".join(f"{d} {hf[d, n]:.1f} tok/s" for d in both), flush=True)
    print("| dtype | conc | tok/s | vs HF (faster dtype) | step ms | kernel ms | "
          "bytes/step | of bandwidth (step / kernel) |\n|---|---|---|---|---|---|---|---|")
    prefill = {}
    for dtype in dtypes:
        eng = engine(args.model, SPEC_OF[dtype])
        itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        for n in levels:
            r = decode_row(eng, prompts(n, args.prompt_len, args.model), args.max_tokens)
            faster = max(hf[d, n] for d in both) if hf else None
            ratio = f"{r['tok/s'] / faster:.2f}x" if faster else "-"
            line = f"| {dtype} | {n} | {r['tok/s']:.1f} | {ratio} | {r['step']:.2f} | " \
                   f"{r['kernel']:.2f} |"
            if n == 1:
                context = args.prompt_len + args.max_tokens // 2
                step_bytes = decode_bytes(margs, itemsize, context)
                of = [step_bytes / (ms / 1e3) / bandwidth for ms in (r["step"], r["kernel"])]
                line += f" {step_bytes / 1e6:.1f} MB | {of[0]:.0%} / {of[1]:.0%} |"
            else:
                line += " - | - |"
            print(line, flush=True)
        if args.long_prompt:
            long = prompts(1, args.long_prompt, args.model)[0]
            prefill_seconds(eng, long[:256])                               # first use
            prefill[dtype] = prefill_seconds(eng, long)
        eng.close()
    flops = prefill_flops(margs, args.long_prompt) if args.long_prompt else 0.0
    for dtype, seconds in prefill.items():
        rate = flops / seconds
        print(f"prefill of {args.long_prompt} tokens, {dtype}: {seconds:.2f} s, "
              f"{flops / 1e9:.0f} useful GFLOP, {rate / 1e9:.1f} GFLOP/s = "
              f"{rate / peaks[dtype]:.0%} of the {dtype} matmul peak")


if __name__ == "__main__":
    main()
