"""What bench/offline.py's speed targets ask of this machine. Prints figures; asserts
nothing.

    .venv/bin/python bench/flops.py [--spec tiny] [--model DIR] [--concurrency 64]
                                    [--prompt-len 256] [--max-tokens 64] [--target 3]
                                    [--mtp-specs tiny,deepseek_v4_flash,deepseek_v4_pro]

Throughput: the matmul arithmetic of the workload (v4serve's compiled backend, run
eagerly so that every product is seen, and transformers' generate, both counted by
torch's FlopCounterMode), this CPU's best sgemm rate on the model's largest prefill
matmul, and the seconds that arithmetic alone takes at that rate, next to the seconds a
`--target`-times-transformers run may take (transformers timed in the same run).

MTP at concurrency 1: a decode step there reads weights more than it computes, so the
floor of a fused MTP step's cost relative to a plain one is the weights it reads: the
main model's step (every layer's dense tensors, its top-k routed experts, the head) plus
the MTP block's (its dense tensors, its experts, the head again), from each spec's shapes
alone. A fused step speeds decode up by (1 + acceptance) / that ratio at best; the
acceptance that 1.3x needs is printed.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import generated  # noqa: E402
from bench.args import bench_parser  # noqa: E402
from bench.offline import decode_row, prompts, run_transformers  # noqa: E402
from contract.checkpoint_layout import expected_shapes  # noqa: E402
from contract.model_args import ModelArgs  # noqa: E402
from runtime.backends.compiled.moe import grouped_mm  # noqa: E402
from runtime.core.config import EngineConfig  # noqa: E402
from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.engine.engine import Engine  # noqa: E402
from runtime.model.params import ModelParams  # noqa: E402
from runtime.weights.loader import load_params  # noqa: E402


@register_flop_formula(grouped_mm)
def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """a [M, K] in runs over experts, b [E, K, N]: each row goes through one matrix."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[-1]


def sgemm_gflops(params: ModelParams, rows: int, repeats: int = 10) -> float:
    """The best rate of torch.mm on [rows, dim] x the widest dense projection's
    transpose: the most the matmuls of a prefill step get from this CPU."""
    widest = max((t for t in params.dense.values() if t.dim() == 2), key=lambda t: t.numel())
    a = torch.randn(rows, widest.shape[1], dtype=widest.dtype)
    b = torch.randn(widest.shape[1], widest.shape[0], dtype=widest.dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * a.shape[1] * b.shape[1] / best / 1e9


def engine_gflop(spec: str, model: Path, batch: list[list[int]], max_tokens: int) -> float:
    engine = Engine.build(EngineConfig(spec=spec, model=model, num_speculative_tokens=0,
                                       enforce_eager=True, enable_prefix_caching=False))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with FlopCounterMode(display=False) as counter:
        engine.generate(batch, params)
    return counter.get_total_flops() / 1e9


def transformers_gflop(hf, batch: list[list[int]], max_tokens: int) -> float:
    with FlopCounterMode(display=False) as counter:
        run_transformers(hf, batch, max_tokens)
    return counter.get_total_flops() / 1e9


def step_elements(shapes: dict[str, tuple[int, ...]], args: ModelArgs,
                  layers: range) -> int:
    """Weight elements one token's pass through `layers` reads: their dense tensors and
    the top-k routed experts of each (the shared experts are dense tensors)."""
    total = 0
    for layer in layers:
        prefix = args.prefix(layer)
        for name, shape in shapes.items():
            if not name.startswith(prefix):
                continue
            if ".experts." not in name:
                total += math.prod(shape)
            elif name.startswith(prefix + "ffn.experts.0."):
                total += math.prod(shape) * args.n_active
    return total


def mtp_cost(spec_name: str) -> float:
    """The least cost of a fused MTP step relative to a plain one at concurrency 1, from
    the spec's shapes alone: (main step + MTP block + head again) / (main step)."""
    args = ModelArgs.from_config(generated.load(spec_name).architecture.CONFIG)
    shapes = expected_shapes(args)
    head = math.prod(shapes["head.weight"])
    main = step_elements(shapes, args, range(args.n_layers)) + head
    return (main + step_elements(shapes, args, args.mtp_layers) + head) / main


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--target", type=float, default=3.0)
    parser.add_argument("--mtp-specs", default="tiny,deepseek_v4_flash,deepseek_v4_pro")
    args = parser.parse_args()
    torch.manual_seed(0)
    batch = prompts(args.concurrency, args.prompt_len, args.model)
    params = load_params(args.model, generated.load(args.spec))
    rate = sgemm_gflops(params, args.concurrency * args.prompt_len // 4)

    from bench.transformers_baseline import load_transformers
    hf = load_transformers(args.model)
    hf_flop = transformers_gflop(hf, batch, args.max_tokens)
    ours_flop = engine_gflop(args.spec, args.model, batch, args.max_tokens)
    tokens = args.concurrency * args.max_tokens
    hf_seconds = tokens / run_transformers(hf, batch, args.max_tokens)
    engine = Engine.build(EngineConfig(spec=args.spec, model=args.model,
                                       num_speculative_tokens=0, enable_prefix_caching=False))
    engine.warmup()
    ours_seconds = tokens / decode_row(engine, batch, args.max_tokens)["tok/s"]
    budget = hf_seconds / args.target

    print(f"workload: {args.concurrency} prompts x {args.prompt_len} tokens, "
          f"{args.max_tokens} generated each")
    print(f"sgemm, best of torch.mm on this CPU: {rate:.1f} GFLOP/s")
    print("| engine | matmul GFLOP | seconds | GFLOP/s | seconds at the sgemm rate |")
    print("|---|---|---|---|---|")
    for name, flop, seconds in (("transformers generate", hf_flop, hf_seconds),
                                ("v4serve compiled", ours_flop, ours_seconds)):
        print(f"| {name} | {flop:.1f} | {seconds:.2f} | {flop / seconds:.1f} | "
              f"{flop / rate:.2f} |")
    print(f"{args.target:g}x transformers allows {budget:.2f} s: the matmuls alone at the "
          f"sgemm rate take {ours_flop / rate / budget:.0%} of it, and the whole run must "
          f"average {ours_flop / budget:.1f} GFLOP/s ({ours_flop / budget / rate:.0%} of "
          f"the sgemm rate)")

    print("| spec | layers | fused MTP step / plain step, at least | acceptance 1.3x needs |")
    print("|---|---|---|---|")
    for name in args.mtp_specs.split(","):
        ratio = mtp_cost(name)
        layers = generated.load(name).architecture.CONFIG["num_hidden_layers"]
        print(f"| {name} | {layers} | {ratio:.2f}x | {1.3 * ratio - 1:.0%} |")


if __name__ == "__main__":
    main()
