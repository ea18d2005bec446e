"""The engine flags (vLLM's names) that `v4serve serve`, `generate`, `compile` and `plan`
share, and the EngineConfig they make. Defining the parsers imports no torch: the engine
is imported by the commands that build one."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.core.speculation import POLICIES
from runtime.planning.engram_tables import PLACEMENTS as ENGRAM_PLACEMENTS
from server.cli.spec_check import (
    CACHE_DTYPES,
    StaleSpecError,
    default_model,
    load_current,
    served,
)

if TYPE_CHECKING:
    from runtime.core.config import EngineConfig
    from runtime.engine.engine import Engine

def engine_command(subparsers: argparse._SubParsersAction, name: str, summary: str,
                   description: str) -> argparse.ArgumentParser:
    """A subcommand that builds an engine: its parser, with the engine flags."""
    parser = subparsers.add_parser(name, help=summary, description=description)
    add_engine_args(parser)
    return parser


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_limit_args(parser)
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint directory in the official format "
                             "(default: models/<spec> in the repository)")
    parser.add_argument("--prefix-affinity-threshold", type=int, default=4,
                        help="a request goes to the rank holding its longest cached prefix "
                             "unless that rank runs more than this many requests beyond the "
                             "least-loaded one (default: 4)")
    parser.add_argument("--fair-share-preemption", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="while every running slot is taken, a request whose body has "
                             "nothing running preempts (recompute) the latest row of the "
                             "body running the most, if that body runs more than its share "
                             "of --max-num-seqs: no body holds another's first token for "
                             "the length of its outputs (default: on)")
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
    parser.add_argument("--kv-cache-dtype", choices=CACHE_DTYPES, default="auto",
                        help="cache entry formats: auto, the spec's; fp8, its family's "
                             "served ones (V4: fp8_ds main entries, FP4 indexer keys; V4.1: "
                             "fp8_32 windows, fp4_16 compressed KV, fp4_32 index keys): the "
                             "spec's own or its <spec>-fp8 variant (default: auto)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="MTP draft tokens per step (with --speculative-policy adaptive: "
                             "the most a step may take); 0 disables MTP (default: the spec's)")
    parser.add_argument("--speculative-policy", choices=POLICIES, default="fixed",
                        help="fixed: every decode step drafts --num-speculative-tokens; "
                             "adaptive: each step drafts the K in 0..--num-speculative-tokens "
                             "with the most expected tokens per second, from the measured "
                             "cost of each K and the running acceptance (default: fixed)")
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
    parser.add_argument("--engram-placement", choices=ENGRAM_PLACEMENTS, default="host",
                        help="where a V4.1 spec's Engram tables live (vLLM's "
                             "--engram-config): device, sharded across the ranks' device "
                             "memory by row range; host, one copy per node in host shared "
                             "memory that each step reads its rows from, leaving the "
                             "device memory to the cache (default: host; no effect on a "
                             "spec without Engram)")


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
    (a missing file, generated/ older than the spec, or a spec codegen only plans)."""
    from runtime.core.config import EngineConfig

    package = load_current(args.spec)              # --spec tiny or --spec specs/tiny.yaml
    if not getattr(package, "LAUNCHABLE", True):
        raise StaleSpecError(f"--spec {args.spec} cannot run yet: {package.NO_KERNELS}")
    spec = package.SPEC_NAME
    return EngineConfig(
        **limit_fields(args), model=args.model or default_model(spec),
        prefix_affinity_threshold=args.prefix_affinity_threshold,
        fair_share_preemption=args.fair_share_preemption,
        kv_cache_memory=args.kv_cache_memory, device=args.device,
        device_memory=args.device_memory if args.device_memory is not None
        else _own_device_memory(args, spec),
        gpu_memory_utilization=args.gpu_memory_utilization,
        engram_placement=args.engram_placement,
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
    return dict(spec=served(args.spec, args.kv_cache_dtype).SPEC_NAME,
                num_speculative_tokens=args.num_speculative_tokens,
                speculative_policy=args.speculative_policy,
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


def build_engine(args: argparse.Namespace) -> Engine:
    """The engine for these flags, or SystemExit with a one-line reason."""
    from runtime.engine.engine import Engine
    from runtime.executor.workers import WorkerDied
    from runtime.planning.admission import ConfigError
    from runtime.weights.loader import CheckpointError

    try:
        return Engine.build(engine_config(args))
    except (ConfigError, CheckpointError, KeyError, ValueError, WorkerDied) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise SystemExit(f"v4serve: {reason}") from None
