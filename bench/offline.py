"""Offline throughput on the tiny spec: v4serve at several concurrencies, MTP on and off,
beside transformers' generate on the same checkpoint. Prints figures; asserts nothing.

    .venv/bin/python bench/offline.py [--model DIR] [--prompt-len 256] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.cli import default_model  # noqa: E402
from runtime.engine import Engine, EngineConfig  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402
from tests.model.support import load_transformers  # noqa: E402


def prompts(n: int, length: int, model: Path) -> list[list[int]]:
    """Openings of held-out standard-library files when the checkpoint has a tokenizer
    (what the embedded model was trained for), else random token ids."""
    if (model / "tokenizer.json").exists():
        from bench.train_tiny import corpus_files, split
        from runtime.tokenizer import Tokenizer

        tok = Tokenizer(model)
        texts = [f.read_text(errors="replace") for f in split(corpus_files())[1]]
        ids = [tok.encode(t)[:length] for t in texts if len(tok.encode(t)) >= length]
        return [ids[i % len(ids)] for i in range(n)]
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(2, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def run_v4serve(spec: str, model: Path, batch: list[list[int]], k: int,
                max_tokens: int) -> dict:
    engine = Engine.build(EngineConfig(spec=spec, model=model, num_speculative_tokens=k))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.generate(batch[:1], SamplingParams(temperature=0, max_tokens=2))   # warm up
    engine.runner.timing.__init__()
    engine.stats.__init__()
    engine.runner.dispatches.clear()
    start = time.perf_counter()
    outputs = engine.generate(batch, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.output_ids) for o in outputs)
    s, t = engine.stats, engine.runner.timing
    return {
        "tok/s": tokens / seconds, "dispatches/req": sum(engine.dispatches.values()) / len(batch),
        "steps": s.steps, "sched ms/step": 1e3 * s.schedule_seconds / s.steps,
        "marshal ms/step": 1e3 * t.marshal / s.steps, "kernel ms/step": 1e3 * t.kernel / s.steps,
        "sample ms/step": 1e3 * t.sample / s.steps,
        "acceptance": s.accepted_tokens / s.draft_tokens if s.draft_tokens else None,
    }


def run_transformers(model, batch: list[list[int]], max_tokens: int) -> float:
    ids = torch.tensor(batch)
    with torch.inference_mode():
        mask = torch.ones_like(ids)
        model.generate(ids[:, :8], attention_mask=mask[:, :8], max_new_tokens=2,
                       do_sample=False, pad_token_id=0)                    # warm up
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    seconds = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny")
    parser.add_argument("--model", type=Path, default=default_model("tiny"))
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8,32,64")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"spec {args.spec}, {args.model}, prompt {args.prompt_len} tokens, {args.max_tokens} "
          f"generated, greedy, {torch.get_num_threads()} CPU threads")
    header = ("engine", "conc", "MTP", "tok/s", "disp/req", "steps", "sched", "marshal",
              "kernel", "sample", "accept")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for n in levels:
        batch = prompts(n, args.prompt_len, args.model)
        for k in (0, 1):
            r = run_v4serve(args.spec, args.model, batch, k, args.max_tokens)
            accept = f"{r['acceptance']:.1%}" if r["acceptance"] is not None else "-"
            print(f"| v4serve | {n} | {'on' if k else 'off'} | {r['tok/s']:.1f} | "
                  f"{r['dispatches/req']:.1f} | {r['steps']} | {r['sched ms/step']:.2f} | "
                  f"{r['marshal ms/step']:.2f} | {r['kernel ms/step']:.1f} | "
                  f"{r['sample ms/step']:.2f} | {accept} |", flush=True)
    hf = load_transformers(args.model)
    for n in (1, max(levels)):
        tps = run_transformers(hf, prompts(n, args.prompt_len, args.model), args.max_tokens)
        print(f"| transformers generate | {n} | - | {tps:.1f} | - | - | - | - | - | - | - |",
              flush=True)
    print("columns sched/marshal/kernel/sample: milliseconds per engine step")


if __name__ == "__main__":
    main()
