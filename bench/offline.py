"""Offline throughput on the tiny spec, every figure of one run side by side: v4serve's
compiled backend and its torch reference backend at several concurrencies, MTP off and
at each K asked (or chosen per step: adaptive), transformers' generate on the same
checkpoint, and the prefill of one long prompt on both backends. Prints figures; asserts
nothing.

    .venv/bin/python bench/offline.py [--model DIR] [--prompt-len 256] [--max-tokens 64]
                                      [--concurrency 1,64] [--backends compiled,torch]
                                      [--long-prompt 16000] [--device cpu]
                                      [--executors uni,mp] [--kv-cache-dtypes auto,fp8]
                                      [--speculation 0,1,2,3,adaptive] [--deep]
                                      [--repeat 1] [--interleave] [--spread]
                                      [--requests N]

`--speculation` lists the MTP settings to run: K drafts every step (0: MTP off), or
`adaptive` (--speculative-policy adaptive up to the spec's largest K). A setting given
twice is a control: a second engine of the same setting ("K=1 again"), whose ratio to
the first (printed after the table) is what the machine's noise alone makes of two equal
settings. With more than one, a summary compares adaptive with the best fixed K at each
concurrency (a control is not a candidate for the best), and the
column "= K=0" counts the outputs identical to the first setting's (greedy: all of
them, or a K's graphs are wrong). `--deep` runs the 16-layer model of specs/tiny-deep.yaml
instead, its checkpoint built from --model by bench/deep_checkpoint.py (the embedded
model's layers, then layers that compute in full and pass their input on: the embedded
model's outputs and acceptance at four times the depth).

`adaptive@REV` in `--speculation` adds the adaptive policy as it was at git revision
REV (its runtime/core/speculation.py, read with `git show`) on an engine of today's
code: a change to the policy side by side with what it changes, in the same rounds
(the summary adds their paired ratio).

`--spread` gives request i of n max-tokens (i + 1) / n tokens, so that a batch drains
from n rows to 1 as requests of mixed lengths do (the best K at n rows and at a few rows
can differ: a fixed K holds one of them).

`--requests N` runs N requests (N different prompts, in turn) at each concurrency c, at
most c in flight: one ends, the next starts, as `vllm bench serve --max-concurrency c
--num-prompts N` does. Prompts differ in how well they draft (the embedded model keeps
all of a held-out file's drafts and half of another's): one request at concurrency 1
measures one prompt's best K, N of them a mix's.

`--repeat N` runs N rounds, each every setting at every concurrency in turn (in reverse
order every other round), and reports the median round of each row: on a shared machine,
settings run minutes apart otherwise see different loads. For adaptive, the summary adds
its ratio to the best fixed K round by round, and the median of those ratios: paired, a
round's slow minutes divide out. With `--interleave` the settings of a round run
together, one engine step of each in turn, so that the slow seconds of a shared machine
fall on all of them alike; each setting's figures count its own steps' seconds.

`--kv-cache-dtypes auto,fp8` adds rows with the cache entries in V4's served formats
(server/cli/spec_check.served: the spec's own, or its -fp8 variant), labelled "fp8".

Graphs compile (or load from the on-disk cache) before anything is timed; the first
line per backend says how long that took.
"""
from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import generated  # noqa: E402
from bench.args import bench_parser  # noqa: E402
from runtime.backends.compiled.graphs import cache_dir  # noqa: E402
from runtime.core.config import EngineConfig  # noqa: E402
from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.engine.engine import Engine  # noqa: E402
from runtime.planning.admission import servable_ks  # noqa: E402
from server.cli.spec_check import served  # noqa: E402

AGAIN = " again"         # the label of a setting's copy (a control)
HEADER = ("engine", "conc", "MTP", "tok/s", "vs HF", "disp/req", "steps", "step ms",
          "sched", "marshal", "kernel", "sample", "host %", "accept", "K chosen", "= K=0")


def prompts(n: int, length: int, model: Path) -> list[list[int]]:
    """Openings of held-out standard-library files when the checkpoint has a tokenizer
    (what the embedded model was trained for), else random token ids."""
    if (model / "tokenizer.json").exists() and length <= 1024:
        from bench.train_tiny import corpus_files, split
        from runtime.text.tokenizer import Tokenizer

        tok = Tokenizer(model)
        texts = [f.read_text(errors="replace") for f in split(corpus_files())[1]]
        ids = [tok.encode(t)[:length] for t in texts if len(tok.encode(t)) >= length]
        return [ids[i % len(ids)] for i in range(n)]
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(2, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def settings(spec: str, given: str) -> dict[str, tuple[int, str]]:
    """(K, policy) of each --speculation entry by its label: a K, "adaptive" (up to
    the spec's largest servable K), or "adaptive@REV" (that, as the policy was at git
    revision REV). An entry given twice is a control: its second engine is labelled
    "... again"."""
    most = max(servable_ks(generated.load(spec).contract))
    out: dict[str, tuple[int, str]] = {}
    for s in given.split(","):
        setting = (most, s) if s.split("@")[0] == "adaptive" else (int(s), "fixed")
        name = label(*setting)
        if name + AGAIN in out:
            raise SystemExit(f"--speculation: {s} given more than twice (one control each)")
        out[name + AGAIN if name in out else name] = setting
    return out


def label(k: int, policy: str) -> str:
    if policy.startswith("adaptive"):
        return f"adaptive <= {k}" + policy.removeprefix("adaptive")
    return f"K={k}" if k else "off"


def policy_at(rev: str, k: int):
    """The adaptive policy over K up to `k` as runtime/core/speculation.py had it at git
    revision `rev`."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{rev}:runtime/core/speculation.py"], cwd=root,
                          capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"speculation_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module           # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.AdaptiveSpeculation(k)


def build(args, backend: str, k: int, executor: str = "uni", cache: str = "auto",
          policy: str = "fixed") -> Engine:
    # the prompts repeat (held-out files, cycled): with prefix caching the figures would
    # measure reuse, which bench/prefix.py measures; here every prompt is computed
    spec = served(args.spec, cache).SPEC_NAME
    policy, _, rev = policy.partition("@")
    config = EngineConfig(spec=spec, model=args.model, num_speculative_tokens=k,
                          speculative_policy=policy, backend=backend, device=args.device,
                          distributed_executor_backend=executor, enable_prefix_caching=False)
    engine = Engine.build(config)
    if rev:
        engine.scheduler.speculation = policy_at(rev, k)
    start = time.perf_counter()
    seconds = engine.warmup()
    if seconds:
        name = label(k, policy + (rev and "@" + rev))
        print(f"# {backend} MTP {name}: {len(seconds)} graphs compiled or "
              f"loaded in {time.perf_counter() - start:.1f} s", flush=True)
    return engine


def _sync(device: str | None) -> None:
    if device and device.startswith("cuda"):
        torch.cuda.synchronize()


def lengths(max_tokens: int, n: int, spread: bool) -> list[int]:
    """The tokens each of `n` requests generates: `max_tokens` each, or spread (request i
    of n: max_tokens (i + 1) / n), a batch that drains from n rows to 1 as requests of
    mixed lengths do."""
    return [max(1, max_tokens * (i + 1) // n) if spread else max_tokens for i in range(n)]


def decode_row(engine: Engine, batch: list[list[int]], max_tokens: int | list[int],
               concurrency: int | None = None) -> dict:
    return decode_rows({"": engine}, batch, max_tokens, concurrency)[""]


def decode_rows(engines: dict[str, Engine], batch: list[list[int]],
                max_tokens: int | list[int], concurrency: int | None = None,
                shuffled: bool = True) -> dict[str, dict]:
    """Each engine's figures for `batch` (each request generating `max_tokens`, or its
    own of a list), at most `concurrency` requests in flight (a closed loop: one ends,
    the next in `batch` starts; None: all at once), the engines stepping in turn (one
    step of each, then again) so that a shared machine's slow seconds fall on every
    engine alike; each engine's seconds are its own steps'. Each turn goes in a new
    order (seeded; `shuffled` False: the engines' order every turn): a step runs slower
    right after a dearer engine's than after a plain one (the caches it left cold), and
    in a fixed order the engine after the dearest pays for it on every step
    (`bench/policy_costs.py --excess --fixed-order`: the adaptive engine's plain steps,
    stepping after fixed K=3's, took 4% more than fixed K=0's at the same moments, where
    fixed K=0's own steps measured the same way come to 1-2%)."""
    each = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(batch)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in each]
    width = concurrency or len(batch)
    ids = {name: [] for name in engines}
    seconds, final = dict.fromkeys(engines, 0.0), {name: {} for name in engines}
    for name, engine in engines.items():
        engine.generate(batch[:2], SamplingParams(temperature=0, max_tokens=4))  # first use
        engine.executor.timing.__init__()
        engine.stats.__init__()
        engine.executor.dispatches.clear()
        _admit(engine, ids[name], batch, params, width)
    running, order = list(engines), random.Random(0)
    while running:
        for name in order.sample(running, len(running)) if shuffled else list(running):
            engine = engines[name]
            start = time.perf_counter()
            outputs = engine.step()
            _sync(engine.config.device)
            seconds[name] += time.perf_counter() - start
            final[name].update((o.request_id, o) for o in outputs if o.finished)
            _admit(engine, ids[name], batch, params, width - len(ids[name]) + len(final[name]))
            if not engine.has_unfinished():
                running.remove(name)
    return {name: _figures(engine, [final[name][i] for i in ids[name]], seconds[name])
            for name, engine in engines.items()}


def _admit(engine: Engine, ids: list[str], batch: list[list[int]],
           params: list[SamplingParams], room: int) -> None:
    """Add up to `room` of the requests of `batch` not yet added (their ids to `ids`)."""
    for p, q in list(zip(batch, params))[len(ids):len(ids) + max(room, 0)]:
        ids.append(engine.add_request(p, q).request_id)


def _figures(engine: Engine, outputs: list, seconds: float) -> dict:
    tokens = sum(len(o.output_ids) for o in outputs)
    chosen = engine.stats.decode_steps_by_k
    s, t = engine.stats, engine.executor.timing
    step = seconds / s.steps
    host = (s.schedule_seconds + t.marshal + t.sample) / s.steps
    return {
        "tok/s": tokens / seconds, "disp/req": sum(engine.dispatches.values()) / len(outputs),
        "steps": s.steps, "step": 1e3 * step, "sched": 1e3 * s.schedule_seconds / s.steps,
        "marshal": 1e3 * t.marshal / s.steps, "kernel": 1e3 * t.kernel / s.steps,
        "sample": 1e3 * t.sample / s.steps, "host": host / step,
        "accept": s.accepted_tokens / s.draft_tokens if s.draft_tokens else None,
        "chosen": " ".join(f"{k}:{n}" for k, n in sorted(chosen.items()))
                  + (f" (twin {s.twin_steps})" if s.twin_steps else ""),
        "outputs": [o.output_ids for o in outputs],
    }


def prefill_seconds(engine: Engine, prompt: list[int]) -> float:
    """Seconds from queueing `prompt` to its first token (the whole prefill)."""
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    _sync(engine.config.device)
    return time.perf_counter() - start


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


def _row(backend: str, n: int, mtp: str, r: dict, hf: float | None, same: str) -> str:
    ratio = f"{r['tok/s'] / hf:.2f}x" if hf else "-"
    accept = f"{r['accept']:.1%}" if r["accept"] is not None else "-"
    return (f"| v4serve {backend} | {n} | {mtp} | {r['tok/s']:.1f} | {ratio} | "
            f"{r['disp/req']:.1f} | {r['steps']} | {r['step']:.1f} | {r['sched']:.2f} | "
            f"{r['marshal']:.2f} | {r['kernel']:.1f} | {r['sample']:.2f} | "
            f"{100 * r['host']:.0f}% | {accept} | {r['chosen']} | {same} |")


def _same(r: dict, first: dict | None) -> str:
    """How many of the row's outputs are the first setting's (greedy: every one)."""
    if first is None:
        return "-"
    same = sum(a == b for a, b in zip(r["outputs"], first["outputs"]))
    return f"{same}/{len(r['outputs'])}"


def rounds(engines: dict[str, Engine], levels: list[int], args) -> dict[tuple[str, int],
                                                                         list[dict]]:
    """`--repeat` rounds, each running every setting at every concurrency in turn, so
    that a shared machine's slow minutes fall on all settings alike; every other round
    in reverse, so that no setting always runs first or last. An adaptive engine keeps
    what it learned from one round to the next, as a server does."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for i in range(args.repeat):
        for n in levels:
            count = max(n, args.requests or n)
            batch = prompts(count, args.prompt_len, args.model)
            tokens = lengths(args.max_tokens, count, args.spread)
            order = list(engines.items())[::-1 if i % 2 else 1]
            if args.interleave:
                together = decode_rows(dict(order), batch, tokens, n)
            for mtp, engine in order:
                runs.setdefault((mtp, n), []).append(
                    together[mtp] if args.interleave else decode_row(engine, batch, tokens, n))
    return runs


def median(runs: list[dict]) -> dict:
    """The run of median throughput."""
    return sorted(runs, key=lambda r: r["tok/s"])[len(runs) // 2]


def _speculation_summary(rates: dict[tuple[str, int], dict[str, list[float]]]) -> None:
    """Adaptive against the best fixed K (by its median), per backend and concurrency:
    on the median figures; round by round, against each round's best; and paired, the
    median over rounds of adaptive over the best K of the same round."""
    for (backend, n), by in rates.items():
        for copy, runs in by.items():
            if copy.endswith(AGAIN):
                _control(backend, n, copy.removesuffix(AGAIN), by[copy.removesuffix(AGAIN)],
                         runs)
        by = {mtp: r for mtp, r in by.items() if not mtp.endswith(AGAIN)}
        fixed = {mtp: r for mtp, r in by.items() if not mtp.startswith("adaptive")}
        adaptive = [(mtp, r) for mtp, r in by.items() if mtp.startswith("adaptive")]
        if not fixed or not adaptive:
            continue
        mid = {mtp: sorted(r)[len(r) // 2] for mtp, r in fixed.items()}
        best = max(mid, key=mid.get)
        for mtp, runs in adaptive:
            rate = sorted(runs)[len(runs) // 2]
            beats = all(rate > r for r in mid.values())
            tops = [max(fixed, key=lambda m: fixed[m][i]) for i in range(len(runs))]
            each = [f"{a / fixed[top][i]:.3f}x ({top})"
                    for i, (a, top) in enumerate(zip(runs, tops))]
            paired = sorted(a / b for a, b in zip(runs, fixed[best]))
            print(f"{backend}, concurrency {n}: {mtp} {rate:.1f} tok/s, best fixed {best} "
                  f"{mid[best]:.1f}: {rate / mid[best]:.3f}x"
                  f"{' (beats every fixed K)' if beats else ''}; round by round, against "
                  f"that round's best: {', '.join(each)}; paired, "
                  f"against {best}: median {paired[len(paired) // 2]:.3f}x")
        for mtp, runs in adaptive[1:]:
            _versus(backend, n, adaptive[0], (mtp, runs))


def _versus(backend: str, n: int, a: tuple[str, list[float]],
            b: tuple[str, list[float]]) -> None:
    """Two adaptive settings (one at a git revision), round by round and paired."""
    ratios = [x / y for x, y in zip(a[1], b[1])]
    print(f"{backend}, concurrency {n}: {a[0]} against {b[0]}: round by round "
          f"{', '.join(f'{r:.3f}x' for r in ratios)}; paired: median "
          f"{sorted(ratios)[len(ratios) // 2]:.3f}x")


def _control(backend: str, n: int, mtp: str, runs: list[float], copies: list[float]) -> None:
    """A setting against its copy (the same engine built twice, run in the same rounds):
    the spread of the figures when nothing differs, the floor under any comparison."""
    mid = sorted(runs)[len(runs) // 2]
    again = sorted(copies)[len(copies) // 2]
    paired = sorted(a / b for a, b in zip(copies, runs))
    print(f"{backend}, concurrency {n}: control, {mtp} against its copy: {again:.1f} tok/s "
          f"against {mid:.1f}: {again / mid:.3f}x; round by round: "
          f"{', '.join(f'{a / b:.3f}x' for a, b in zip(copies, runs))}; paired: median "
          f"{paired[len(paired) // 2]:.3f}x")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--backends", default="compiled,torch")
    parser.add_argument("--long-prompt", type=int, default=16000,
                        help="tokens of the prompt whose prefill is timed (0: skip)")
    parser.add_argument("--device", default=None, help="default: the spec's")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--kv-cache-dtypes", default="auto",
                        help="auto (the spec's cache formats), fp8 (V4's served ones), or "
                             "both: auto,fp8")
    parser.add_argument("--executors", default="uni",
                        help="uni (every rank in one process), mp (a process per rank), "
                             "or both: uni,mp")
    parser.add_argument("--speculation", default="0,1",
                        help="MTP settings, comma-separated: K (0: off), adaptive, or "
                             "adaptive@REV (the policy as at git revision REV)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every setting and concurrency in turn; the "
                             "figures are the median round's")
    parser.add_argument("--interleave", action="store_true",
                        help="run a round's settings together, one engine step of each "
                             "in turn, each timed by its own steps' seconds")
    parser.add_argument("--deep", action="store_true",
                        help="the 16-layer model of specs/tiny-deep.yaml, built from --model")
    parser.add_argument("--spread", action="store_true",
                        help="request i of n generates max-tokens (i + 1) / n tokens: the "
                             "batch drains from n rows to 1 (requires --no-transformers)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per concurrency, at most that many in flight (one "
                             "ends, the next starts); default: the concurrency, all at once")
    args = parser.parse_args()
    if args.requests and not args.no_transformers:
        parser.error("--requests compares the engine's settings only: add --no-transformers")
    if args.spread and not args.no_transformers:
        parser.error("--spread compares the engine's settings only: add --no-transformers")
    if args.deep:
        from bench.deep_checkpoint import build as build_deep

        args.spec = "tiny-deep"
        layers = generated.load(args.spec).architecture.CONFIG["num_hidden_layers"]
        args.model = build_deep(args.model, cache_dir() / "checkpoints" / args.spec, layers)
    levels = [int(c) for c in args.concurrency.split(",")]
    backends = args.backends.split(",")
    print(f"spec {args.spec}, {args.model}, prompt {args.prompt_len} tokens, "
          f"{'up to ' if args.spread else ''}{args.max_tokens} generated"
          f"{' (request i of n: (i + 1) / n of it)' if args.spread else ''}"
          f"{f', {args.requests} requests per concurrency' if args.requests else ''}, greedy, "
          f"{torch.get_num_threads()} CPU threads, device {args.device or 'the spec default'}",
          flush=True)
    hf_tps: dict[int, float] = {}
    if not args.no_transformers:
        from bench.transformers_baseline import load_transformers

        hf = load_transformers(args.model)
        for n in levels:
            hf_tps[n] = run_transformers(hf, prompts(n, args.prompt_len, args.model),
                                         args.max_tokens)
        del hf
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    for n in levels:
        if n in hf_tps:
            print(f"| transformers generate | {n} | - | {hf_tps[n]:.1f} | 1.00x |"
                  + " - |" * (len(HEADER) - 5), flush=True)
    prefill: dict[str, float] = {}
    rates: dict[tuple[str, int], dict[str, float]] = {}
    long = prompts(1, args.long_prompt, args.model)[0] if args.long_prompt else None
    caches = args.kv_cache_dtypes.split(",")
    if len(caches) > 1 and len(backends) > 1:
        parser.error("--kv-cache-dtypes with two values takes one backend")
    for executor, backend, cache in ((e, b, c) for e in args.executors.split(",")
                                     for b in backends for c in caches):
        name = backend + (" mp" if executor == "mp" else "") + (" fp8" if cache == "fp8" else "")
        engines = {name: build(args, backend, k, executor, cache, policy)
                   for name, (k, policy) in settings(args.spec, args.speculation).items()}
        runs = rounds(engines, levels, args)
        for n in levels:
            first = None
            for mtp in engines:
                r = median(runs[mtp, n])
                print(_row(name, n, mtp, r, hf_tps.get(n), _same(r, first)), flush=True)
                first = first or r
                rates.setdefault((name, n), {})[mtp] = [r["tok/s"] for r in runs[mtp, n]]
        off = engines.get("off")
        if long and off is not None and executor == "uni":
            prefill_seconds(off, long[:256])                              # first use
            prefill[name] = prefill_seconds(off, long)
        for engine in engines.values():
            engine.close()
    print("columns step/sched/marshal/kernel/sample: milliseconds per engine step; host %: "
          "(sched + marshal + sample) / step; K chosen: decode steps per K; = K=0: outputs "
          "identical to the first setting's")
    _speculation_summary(rates)
    for backend, seconds in prefill.items():
        print(f"prefill of a {args.long_prompt}-token prompt, {backend} backend: "
              f"{seconds:.2f} s ({args.long_prompt / seconds:.0f} tok/s)")
    if len(prefill) == 2:
        (a_name, a), (b_name, b) = prefill.items()
        print(f"prefill speed-up, {a_name} over {b_name}: {b / a:.1f}x")


if __name__ == "__main__":
    main()
