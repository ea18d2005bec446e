"""`v4serve serve` / `python -m server`: the OpenAI-compatible server under uvicorn.

SIGTERM (or Ctrl-C) drains: new requests get 503, requests in flight run to the end
(up to --drain-timeout seconds), then the process exits 0. Defining the parser imports
nothing heavy; `run` imports the engine and the server.
"""
from __future__ import annotations

import argparse
import errno
import gc
import json
import logging
import os
import socket
import subprocess
import time

from runtime.planning import plan_report
from server.cli.engine_args import add_engine_args, engine_command, positive_int

log = logging.getLogger("v4serve")

# Where the API key is read from when --api-key is not given (vLLM's name first): the
# command line is visible to every local user in `ps`, the environment is not.
API_KEY_ENV = ("VLLM_API_KEY", "V4SERVE_API_KEY")
# the reasoning and tool-call parsers, by the chat format they read (server/v4_output.py);
# a parser of the other family's format than the spec's is refused at start
PARSERS = ("deepseek_v4", "deepseek_v41")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    configure(engine_command(
        subparsers, "serve", "serve a spec over an OpenAI-compatible HTTP API",
        "Serve a spec's model over HTTP: /v1/completions, /v1/chat/completions, /v1/models, "
        "/health, /metrics, /server_info, /tokenize, /detokenize."))


def configure(parser: argparse.ArgumentParser) -> None:
    """The server's flags, beside the engine's."""
    parser.set_defaults(defer_compile=True)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=8000,
                        help="port to listen on (default: 8000)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the spec name)")
    parser.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' with one of these keys "
                             "(default: $VLLM_API_KEY, else $V4SERVE_API_KEY, else no key)")
    parser.add_argument("--metrics-require-api-key", action="store_true",
                        help="/metrics needs the API key too (needs --api-key) (default: "
                             "off, /metrics is public as in vLLM)")
    parser.add_argument("--require-cache-salt", action="store_true",
                        help="refuse (400) a completion or chat request without a "
                             "cache_salt: requests share prefix-cache entries only with "
                             "requests of the same salt (default: off; unsalted requests "
                             "share with each other)")
    parser.add_argument("--cache-salt-from-api-key", action="store_true",
                        help="key every request's prefix-cache entries by the API key it "
                             "presents (hashed), its own cache_salt combined with it: "
                             "clients of different keys never share entries or see each "
                             "other's in cached_tokens (needs --api-key) (default: off)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=8 << 20,
                        help="largest request body accepted, in bytes (default: 8 MiB)")
    parser.add_argument("--max-prompts-per-request", type=positive_int, default=256,
                        help="most prompts one completion request may carry (a list of "
                             "prompts; each starts n sequences) (default: 256)")
    parser.add_argument("--max-n", type=positive_int, default=None,
                        help="most choices per prompt a request may ask for (n, best_of) "
                             "(default: --max-num-seqs)")
    parser.add_argument("--max-sequences-per-request", type=positive_int, default=16384,
                        help="most engine requests one request may start: prompts x n "
                             "(or x best_of); above it a 400 (default: 16384, vLLM's "
                             "VLLM_MAX_N_SEQUENCES)")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="seconds SIGTERM waits for requests in flight (default: 60)")
    parser.add_argument("--reasoning-parser", choices=PARSERS, default=None,
                        help="split chat outputs of a thinking prompt into reasoning_content "
                             "and content; deepseek_v4 for a DeepSeek V4 spec, deepseek_v41 "
                             "for a V4.1 one (default: none, the text as generated)")
    parser.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                        help="parse the model's tool calls (DSML) into message.tool_calls; "
                             "deepseek_v4 for a DeepSeek V4 spec, deepseek_v41 for a V4.1 "
                             "one (default: none)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='let the model decide when to call tools (tool_choice "auto"; '
                             "needs --tool-call-parser) (default: off)")
    parser.add_argument("--default-chat-template-kwargs", type=template_kwargs, default=None,
                        metavar="JSON",
                        help='chat template arguments every chat request starts from, as a '
                             'JSON object, e.g. \'{"thinking": true}\'; a request\'s own '
                             "chat_template_kwargs override them (default: none)")
    parser.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                        help="run the engine in a thread of the server process instead of "
                             "an engine-core process of its own (slower; for debugging)")
    parser.set_defaults(func=run)


def template_kwargs(text: str) -> dict:
    """--default-chat-template-kwargs: a JSON object, or a usage error saying why not."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, not {text[:40]!r}")
    return value


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key's keys, else the first API_KEY_ENV variable set (an empty key means
    none); no keys: no authentication."""
    keys = tuple(key for key in args.api_key or () if key)
    if keys:
        return keys
    return next(((os.environ[name],) for name in API_KEY_ENV if os.environ.get(name)), ())


def cache_salts(args: argparse.Namespace, keys: tuple[str, ...]):
    """The server's cache-salt policy; SystemExit for a flag that needs an API key
    without one (it would protect nothing)."""
    from server.cache_salt import CacheSalts

    for flag, on in (("--cache-salt-from-api-key", args.cache_salt_from_api_key),
                     ("--metrics-require-api-key", args.metrics_require_api_key)):
        if on and not keys:
            raise SystemExit(f"v4serve serve: {flag} needs --api-key (or $VLLM_API_KEY)")
    return CacheSalts(args.require_cache_salt, args.cache_salt_from_api_key)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use is an error
    at once, not after minutes of loading. SystemExit names the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"({exc.strerror})"
        raise SystemExit(f"v4serve: cannot listen on {host}:{port}: the address {reason}") \
            from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(args: argparse.Namespace):
    """The server and its state. The engine core process starts with the server and
    loads in the background (/health is 503 until it is ready); with
    --no-engine-process the engine is built and warmed up here first."""
    import uvicorn

    from server.app import ServerState, build_app
    from server.draining import DrainingServer

    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("v4serve serve: --enable-auto-tool-choice needs --tool-call-parser")
    keys = api_keys(args)
    salts = cache_salts(args, keys)
    options = chat_options(args)
    engine, spec, compiling = (_core(args) if args.engine_process else _in_process(args))
    state = ServerState(engine, spec, args.served_model_name or spec.SPEC_NAME,
                        api_key=keys or None, max_body_bytes=args.max_body_bytes,
                        max_n=args.max_n, max_prompts=args.max_prompts_per_request,
                        max_sequences=args.max_sequences_per_request,
                        compile_process=compiling, chat_options=options,
                        cache_salts=salts, metrics_require_api_key=args.metrics_require_api_key)
    config = uvicorn.Config(build_app(state), host=args.host, port=args.port,
                            log_level="info", timeout_graceful_shutdown=args.drain_timeout)
    server = DrainingServer(config, state, args.drain_timeout)
    # what the process holds for its life (modules, the tokenizer, an in-process engine)
    # leaves the collector's generations (as vLLM does): a full collection, which a
    # body of 16k choices' objects triggers, then scans those objects alone, not the
    # whole heap (40-60 ms a time before, on the event loop)
    gc.collect()
    gc.freeze()
    if args.engine_process:
        engine.on_dead = lambda error: _failed_start(server, engine, error)
    return server, state


def chat_options(args: argparse.Namespace):
    """The chat flags and the spec's model family; SystemExit, before the model loads, for
    a parser of the other family's format (or a spec that cannot be served)."""
    from server.chat import ChatOptions, family_of
    from server.cli.spec_check import StaleSpecError, load_current

    try:
        family = family_of(load_current(args.spec))
    except StaleSpecError as exc:
        raise SystemExit(f"v4serve: {exc.args[0] if exc.args else exc}") from None
    try:
        return ChatOptions(args.reasoning_parser, args.tool_call_parser,
                           args.enable_auto_tool_choice, args.default_chat_template_kwargs,
                           family)
    except ValueError as exc:
        raise SystemExit(f"v4serve serve: {exc}") from None


def _failed_start(server, client, error: str) -> None:
    """A core that dies before it was ever ready (a bad checkpoint, a device error) ends
    the server with exit code 1, as a failed in-process load would; one that dies later
    leaves the server answering 503."""
    if not client.ready:
        log.error("v4serve: the engine core failed to start: %s", error)
        server.exit_code = 1
        server.should_exit = True


def _core(args: argparse.Namespace):
    """A client of an engine core process, not started yet."""
    from runtime.planning.admission import ConfigError
    from runtime.process.core_client import CoreClient
    from server.cli.engine_args import engine_config
    from server.cli.spec_check import StaleSpecError

    try:
        client = CoreClient(engine_config(args))
    except (ConfigError, StaleSpecError, KeyError) as exc:
        raise SystemExit(f"v4serve: {exc.args[0] if exc.args else exc}") from None
    started = time.perf_counter()

    def ready(summary: dict) -> None:
        log_summary(summary)
        log.info("ready: the engine core (pid %d) loaded in %.1f s", client.pid,
                 time.perf_counter() - started)

    client.on_ready = ready
    return client, client.spec, None


def _in_process(args: argparse.Namespace):
    """The engine in a thread of this process, built and warmed up."""
    from runtime.engine.async_engine import AsyncEngine
    from server.cli.engine_args import build_engine

    built = build_engine(args)
    log_summary(built.summary())
    compiling = warm_up(built)
    return AsyncEngine(built), built.spec, compiling


def log_summary(summary: dict) -> None:
    """What was loaded and how many tokens fit (the figures /server_info reports)."""
    log.info("spec %s (%s), checkpoint %s, backend %s on %s, %d rank(s)", summary["spec"],
             summary["spec_path"], summary["checkpoint"], summary["backend"],
             summary["device"], summary["ranks"])
    for line in plan_report.render(summary["plan"]).splitlines():   # `v4serve plan`'s
        log.info("plan: %s", line)
    log.info("weights loaded: %.1f MiB per rank", summary["param_bytes_per_rank"] / 2**20)
    for proc in summary.get("processes") or []:
        if "rank" in proc:                 # mp: one line per rank process
            log.info("rank %d: pid %d on %s, %s, weights %.1f MiB, pools %.1f MiB",
                     proc["rank"], proc["pid"], proc["host"], proc["device"],
                     proc["param_bytes"] / 2**20, proc["pool_bytes"] / 2**20)
    log.info("KV cache size: %d tokens per rank (%.1f MiB per rank)",
             summary["pool_tokens_per_rank"], summary["pool_bytes_per_rank"] / 2**20)
    log.info("Maximum concurrency for %d tokens per request: %.2fx",      # vLLM's figure
             summary["max_model_len"],
             summary["ranks"] * summary["pool_tokens_per_rank"] / summary["max_model_len"])


def warm_up(engine) -> subprocess.Popen | None:
    """Load every compiled graph there is; for the ones missing, serve eagerly while a
    background process compiles and saves them (the engine picks each up when saved).
    Returns that process, if one was started."""
    from runtime.process.precompile import compile_missing

    start = time.perf_counter()
    engine.warmup()
    process = compile_missing(engine)
    if process is None and engine.graphs is not None:
        log.info("%d compiled graph(s) loaded in %.1f s", len(engine.graphs.seconds),
                 time.perf_counter() - start)
    return process


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from server.cli.engine_args import run_other_node

    other = run_other_node(args)           # --node-rank > 0: this node's ranks, no API
    if other is not None:
        return other
    start = time.perf_counter()
    sock = bind(args.host, args.port)
    server, state = make_server(args)
    state.engine.start()
    state.ready = True
    log.info("serving %s (spec %s) on http://%s:%d, %.1f s after start; %s",
             state.model_name, state.spec.SPEC_PATH, args.host, args.port,
             time.perf_counter() - start,
             "ready" if state.engine.ready else "the engine core is loading (/health 503)")
    try:
        server.run(sockets=[sock])
    finally:
        state.engine.shutdown()
        if state.compile_process is not None and state.compile_process.poll() is None:
            state.compile_process.terminate()
    return server.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    add_engine_args(parser)
    configure(parser)
    return run(parser.parse_args(argv))
