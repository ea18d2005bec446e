"""`v4serve generate` (offline generation with continuous batching) and `v4serve compile`;
and the engine flags (vLLM's names) that `v4serve serve` shares. Defining the parsers
imports no torch: the engine is imported by the commands that build one."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import generated
from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.engine.spec_check import StaleSpecError, load_current

if TYPE_CHECKING:
    from runtime.engine.engine import Engine, EngineConfig

REPO = Path(generated.__file__).resolve().parent.parent


def default_model(spec: str) -> Path:
    """models/<spec> in the repository: the checkpoint a spec serves by default."""
    return REPO / "models" / spec.replace("_", "-")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_limit_args(parser)
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint directory in the official format "
                             "(default: models/<spec> in the repository)")
    parser.add_argument("--prefix-affinity-threshold", type=int, default=4,
                        help="a request goes to the rank holding its longest cached prefix "
                             "unless that rank runs more than this many requests beyond the "
                             "least-loaded one (default: 4)")
    add_memory_args(parser)
    parser.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                        help="pool bytes per rank (a number, or with a unit: 20GiB), "
                             "overriding the memory plan (default: the plan's, else enough "
                             "for the limits)")
    parser.add_argument("--device", default=None, help="cpu | cuda | npu (default: the spec's)")
    parser.add_argument("--max-logprobs", type=int, default=20,
                        help="most top log-probs a request may ask for (default: 20)")
    parser.add_argument("--max-stop-strings", type=positive_int, default=64,
                        help="most stop strings a request may give (default: 64)")
    parser.add_argument("--max-stop-token-ids", type=positive_int, default=1024,
                        help="most stop token ids a request may give (default: 1024)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="run the compiled backend's graphs without compiling them")
    add_distributed_args(parser)


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    """The spec and the limits in force (shared with `v4serve plan`)."""
    parser.add_argument("--spec", default="tiny",
                        help="spec to serve, by name or file (default: tiny)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="MTP draft tokens per step; 0 disables MTP (default: the spec's)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="token budget per rank per step (default: the spec's)")
    parser.add_argument("--long-prefill-token-threshold", type=int, default=None,
                        help="most prompt tokens of one prefill chunk (default: the spec's)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="most tokens of a request (default: the spec's)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="most running requests (default: the spec's)")
    parser.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill",
                        action="store_false",
                        help="reject prompts longer than one prefill dispatch")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="reuse the pages of cached prompt prefixes, 128-token blocks "
                             "(default: on)")


def add_memory_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """The memory plan's inputs (runtime/planning/memory_plan.py), shared with `v4serve plan`."""
    parser.add_argument("--device-memory", type=parse_bytes, default=None, required=required,
                        help="memory of one rank's device, e.g. 141GiB or 192GB; the pools "
                             "take what the weights and a workspace leave of it "
                             + ("" if required else "(default: the device's own with "
                                "--distributed-executor-backend mp on cuda; otherwise none: "
                                "pools sized by the limits)"))
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="share of the device memory v4serve may use, where one is "
                             "known (--device-memory, or mp on cuda) (default: 0.9)")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_bytes(text: str) -> int:
    from runtime.planning.memory_plan import parse_bytes as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    """Ranks as processes, torchrun style: the environment's NNODES, NODE_RANK,
    MASTER_ADDR and MASTER_PORT are the defaults."""
    env = os.environ
    parser.add_argument("--distributed-executor-backend", choices=("uni", "mp"),
                        default="uni",
                        help="uni: every rank in one process (default); mp: one worker "
                             "process per rank in a torch.distributed group")
    parser.add_argument("--nnodes", type=int, default=int(env.get("NNODES", 1)),
                        help="nodes the ranks span (mp); ranks per node = ranks / nnodes "
                             "(default: $NNODES, else 1)")
    parser.add_argument("--node-rank", type=int, default=int(env.get("NODE_RANK", 0)),
                        help="this node's index; node 0 runs the engine and the API, "
                             "the others run their ranks only (default: $NODE_RANK, else 0)")
    parser.add_argument("--master-addr", default=env.get("MASTER_ADDR", "127.0.0.1"),
                        help="address of node 0, where the process group meets "
                             "(default: $MASTER_ADDR, else 127.0.0.1)")
    parser.add_argument("--master-port", type=int, default=int(env.get("MASTER_PORT", 0)),
                        help="port of the process group (default: $MASTER_PORT, else a free "
                             "one; needed with --nnodes > 1)")
    parser.add_argument("--distributed-timeout", type=float, default=300.0,
                        help="seconds a collective may wait for a rank before the "
                             "engine fails (default: 300)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration of these flags; StaleSpecError if --spec cannot be served
    (a missing file, or generated/ older than the spec)."""
    from runtime.engine.config import EngineConfig

    spec = load_current(args.spec).SPEC_NAME       # --spec tiny or --spec specs/tiny.yaml
    return EngineConfig(
        **limit_fields(args), model=args.model or default_model(spec),
        prefix_affinity_threshold=args.prefix_affinity_threshold,
        kv_cache_memory=args.kv_cache_memory, device=args.device,
        device_memory=args.device_memory if args.device_memory is not None
        else _own_device_memory(args, spec),
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_logprobs=args.max_logprobs, max_stop_strings=args.max_stop_strings,
        max_stop_token_ids=args.max_stop_token_ids, enforce_eager=args.enforce_eager,
        defer_compile=getattr(args, "defer_compile", False),
        distributed_executor_backend=args.distributed_executor_backend,
        nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
        master_port=args.master_port, distributed_timeout=args.distributed_timeout)


def _own_device_memory(args: argparse.Namespace, spec: str) -> int | None:
    """One rank's device memory where each rank has a device of its own (mp on cuda);
    None elsewhere (every rank of `uni` shares one device: pools sized by the limits)."""
    device = args.device or load_current(spec).contract.DEVICE
    if args.distributed_executor_backend != "mp" or device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() \
        else None


def limit_fields(args: argparse.Namespace) -> dict:
    """EngineConfig's fields from add_limit_args' flags."""
    return dict(spec=load_current(args.spec).SPEC_NAME,
                num_speculative_tokens=args.num_speculative_tokens,
                max_num_batched_tokens=args.max_num_batched_tokens,
                long_prefill_token_threshold=args.long_prefill_token_threshold,
                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                enable_chunked_prefill=args.enable_chunked_prefill,
                enable_prefix_caching=args.enable_prefix_caching)


def run_other_node(args: argparse.Namespace) -> int | None:
    """On a node other than 0 (--node-rank > 0), run this node's ranks until they end
    and return their exit code; None on node 0."""
    if args.node_rank == 0:
        return None
    from runtime.executor.workers import run_node

    config = engine_config(args)
    if config.distributed_executor_backend != "mp":
        raise SystemExit("v4serve: --node-rank > 0 needs --distributed-executor-backend mp")
    try:
        return run_node(config)
    except ValueError as exc:
        raise SystemExit(f"v4serve: {exc}") from None


def precompile_command(config: EngineConfig) -> list[str]:
    """The command that compiles and saves every graph of this engine configuration."""
    command = [sys.executable, "-m", "runtime.backends.compiled.precompile",
               "--spec", config.spec, "--model", str(config.model)]
    if config.num_speculative_tokens is not None:
        command += ["--num-speculative-tokens", str(config.num_speculative_tokens)]
    if config.device:
        command += ["--device", config.device]
    return command


def build_engine(args: argparse.Namespace) -> Engine:
    """The engine for these flags, or SystemExit with a one-line reason."""
    from runtime.engine.engine import ConfigError, Engine
    from runtime.executor.workers import WorkerDied
    from runtime.weights.loader import CheckpointError

    try:
        return Engine.build(engine_config(args))
    except (ConfigError, CheckpointError, KeyError, ValueError, WorkerDied) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise SystemExit(f"v4serve: {reason}") from None


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=16,
                        help="most tokens generated per prompt (default: 16)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature; 0 is greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus sampling mass, in (0, 1] (default: 1, off)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="sample among the k likeliest tokens; 0 or -1 is off (default: 0)")
    parser.add_argument("--min-p", type=float, default=0.0,
                        help="drop tokens below min_p x the top probability (default: 0, off)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of a repeatable sample (default: none, random)")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="in [-2, 2], per token already generated (default: 0)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="in [-2, 2], per occurrence in the output (default: 0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="> 0, on tokens of the prompt and output (default: 1, off)")
    parser.add_argument("--stop", action="append", default=[],
                        help="stop string (repeatable; default: none)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="keep generating past the end-of-sequence token")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, seed=args.seed,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty, stop=tuple(args.stop),
        ignore_eos=args.ignore_eos)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate offline for prompts given on the command line or a file",
        description="Run prompts through the engine (continuous batching over the spec's "
                    "ranks, chunked prefill, MTP) and print the completions.")
    add_engine_args(parser)
    add_sampling_args(parser)
    parser.add_argument("--prompt", action="append", default=[],
                        help="prompt text (repeatable)")
    parser.add_argument("--prompt-ids", action="append", default=[],
                        help="prompt token ids, comma separated (repeatable)")
    parser.add_argument("--prompts-file", type=Path,
                        help="one prompt per line: text, a JSON string, or a JSON list of "
                             "token ids")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per prompt, then a summary object")
    parser.set_defaults(func=run, defer_compile=True)


def add_compile_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compile", help="compile and save every graph of a spec's compiled backend",
        description="Compile every graph the engine flags need and save it under "
                    "V4SERVE_CACHE_DIR (default ~/.cache/v4serve), so that serve and "
                    "generate start with compiled graphs.")
    add_engine_args(parser)
    parser.set_defaults(func=run_compile)


def run_compile(args: argparse.Namespace) -> int:
    import logging
    import subprocess

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = engine_config(args)
    except StaleSpecError as exc:
        raise SystemExit(f"v4serve: {exc}") from None
    return subprocess.call(precompile_command(config))


class PromptError(ValueError):
    """A prompt the command line or the prompts file got wrong; the message locates it."""


def _prompts(args: argparse.Namespace) -> list[tuple[str, str | list[int]]]:
    """(where it came from, prompt) for every prompt given."""
    prompts: list[tuple[str, str | list[int]]] = [
        (f"--prompt #{i + 1}", p) for i, p in enumerate(args.prompt)]
    for i, text in enumerate(args.prompt_ids):
        try:
            prompts.append((f"--prompt-ids #{i + 1}",
                            [int(t) for t in text.split(",") if t.strip()]))
        except ValueError:
            raise PromptError(f"--prompt-ids {text[:40]!r}: give comma-separated token "
                              "ids") from None
    if args.prompts_file:
        prompts += _prompts_file(args.prompts_file)
    return prompts


def _prompts_file(path: Path) -> list[tuple[str, str | list[int]]]:
    """One prompt per line: a JSON list of token ids, a JSON string (which may hold
    newlines), or else the line as plain text."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"--prompts-file {path}: {exc}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            where = f"{path}:{number}"
            prompts.append((where, _prompt_line(line, where)))
    return prompts


def _prompt_line(line: str, where: str) -> str | list[int]:
    if line.lstrip()[:1] not in ("[", '"'):
        return line
    try:
        value = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PromptError(f"{where}: not a JSON string or list of token ids: {exc}") from None
    if isinstance(value, str) or (isinstance(value, list) and value and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value)):
        return value
    raise PromptError(f"{where}: a JSON line must be a string or a non-empty list of "
                      "integer token ids")


def _no_constant(literal: str):
    raise ValueError(f"{literal} is not allowed")


def _check_prompts(engine: Engine, prompts, params: SamplingParams) -> list[str | list[int]]:
    """Every prompt checked before any runs; PromptError names the first bad one."""
    checked = []
    for where, prompt in prompts:
        if isinstance(prompt, str) and engine.tokenizer is None:
            raise PromptError(f"{where}: the checkpoint has no tokenizer.json; use "
                              "--prompt-ids")
        try:
            engine.validate(engine.tokenizer.encode(prompt) if isinstance(prompt, str)
                            else prompt, params)
        except InvalidParam as exc:
            raise PromptError(f"{where}: {exc}") from None
        checked.append(prompt)
    return checked


def run(args: argparse.Namespace) -> int:
    other = run_other_node(args)            # --node-rank > 0: this node's ranks only
    if other is not None:
        return other
    try:
        prompts = _prompts(args)
        params = sampling_params(args)
    except PromptError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    except InvalidParam as exc:
        print(f"generate: --{exc.param.replace('_', '-')}: {exc}", file=sys.stderr)
        return 2
    if not prompts:
        print("generate: give --prompt, --prompt-ids or --prompts-file", file=sys.stderr)
        return 2
    engine = build_engine(args)
    try:
        return _generate(engine, args, prompts, params)
    finally:
        engine.close()


def _generate(engine: Engine, args: argparse.Namespace, prompts, params) -> int:
    engine.warmup()
    if engine.pending_graphs():
        print(f"generate: {engine.pending_graphs()} graph(s) are not compiled yet and run "
              "eagerly; `v4serve compile` (or a first `v4serve serve`) compiles them",
              file=sys.stderr)
    try:
        checked = _check_prompts(engine, prompts, params)
    except PromptError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    outputs = engine.generate(checked, params)
    summary = _summary(engine, outputs, time.perf_counter() - start)
    for (where, _), output in zip(prompts, outputs):
        if args.json:
            print(json.dumps({"source": where, "prompt_token_ids": output.prompt_ids,
                              "output_token_ids": output.output_ids, "text": output.text,
                              "finish_reason": output.finish_reason,
                              "error": output.error}))
            continue
        if len(outputs) > 1:               # completions run on without a newline
            print(f"=== {where} ===")
        print(output.text if engine.tokenizer else output.output_ids)
    if args.json:
        print(json.dumps(summary))
    else:
        mtp = summary["mtp"]
        accept = f", MTP acceptance {mtp['acceptance_rate']:.1%}" if mtp["drafts"] else ""
        print(f"-- {summary['output_tokens']} tokens in {summary['seconds']:.2f} s "
              f"({summary['output_tokens_per_s']:.1f} tok/s), dispatches "
              f"{summary['dispatches']}{accept}", file=sys.stderr)
    failed = [o for o in outputs if o.error]
    for output in failed:
        print(f"generate: {output.request_id} failed: {output.error}", file=sys.stderr)
    return 1 if failed else 0


def _summary(engine: Engine, outputs, seconds: float) -> dict:
    s = engine.stats
    tokens = sum(len(o.output_ids) for o in outputs)
    return {
        "requests": len(outputs), "output_tokens": tokens, "seconds": round(seconds, 4),
        "output_tokens_per_s": round(tokens / seconds, 2) if seconds else None,
        "steps": s.steps, "dispatches": dict(sorted(engine.dispatches.items())),
        "preemptions": engine.scheduler.num_preemptions,
        **engine.resident(),
        "mtp": {"drafts": s.drafts, "draft_tokens": s.draft_tokens,
                "accepted_tokens": s.accepted_tokens,
                "acceptance_rate": round(s.accepted_tokens / s.draft_tokens, 4)
                if s.draft_tokens else None},
    }
