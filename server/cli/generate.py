"""`v4serve generate`: offline generation with continuous batching, for prompts given on
the command line or in a file."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.core.sampling_params import InvalidParam, SamplingParams
from server.cli.engine_args import build_engine, engine_command, run_other_node

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


# The sampling flags: (flag, type, default, help). --stop and --ignore-eos are added apart.
SAMPLING_FLAGS = (
    ("--max-tokens", int, 16, "most tokens generated per prompt (default: 16)"),
    ("--temperature", float, 0.0, "sampling temperature; 0 is greedy (default: 0)"),
    ("--top-p", float, 1.0, "nucleus sampling mass, in (0, 1] (default: 1, off)"),
    ("--top-k", int, 0, "sample among the k likeliest tokens; 0 or -1 is off (default: 0)"),
    ("--min-p", float, 0.0, "drop tokens below min_p x the top probability (default: 0, off)"),
    ("--seed", int, None, "seed of a repeatable sample (default: none, random)"),
    ("--presence-penalty", float, 0.0, "in [-2, 2], per token already generated (default: 0)"),
    ("--frequency-penalty", float, 0.0, "in [-2, 2], per occurrence in the output (default: 0)"),
    ("--repetition-penalty", float, 1.0, "> 0, on tokens of the prompt and output (default: 1, "
                                         "off)"),
)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    for flag, kind, default, text in SAMPLING_FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=text)
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
    parser = engine_command(
        subparsers, "generate",
        "generate offline for prompts given on the command line or a file",
        "Run prompts through the engine (continuous batching over the spec's ranks, chunked "
        "prefill, MTP) and print the completions.")
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
                              "output_token_ids": list(output.output_ids), "text": output.text,
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
                if s.draft_tokens else None,
                "policy": engine.config.speculative_policy,
                "accepted_per_position": list(s.accepted_per_position),
                "decode_steps_by_k": {str(k): n for k, n in sorted(s.decode_steps_by_k.items())}},
    }
