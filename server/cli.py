"""`v4serve serve` / `python -m server`: the OpenAI-compatible server under uvicorn.

SIGTERM (or Ctrl-C) drains: new requests get 503, requests in flight run to the end
(up to --drain-timeout seconds), then the process exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
import time

import uvicorn

from runtime.async_engine import AsyncEngine
from runtime.cli import add_engine_args, build_engine, precompile_command
from server.app import ServerState, build_app

log = logging.getLogger("v4serve")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a spec over an OpenAI-compatible HTTP API",
        description="Serve a spec's model over HTTP: /v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /metrics, /server_info, /tokenize, /detokenize.")
    configure(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.set_defaults(defer_compile=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the spec name)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--max-body-bytes", type=int, default=8 << 20)
    parser.add_argument("--max-n", type=_positive, default=None,
                        help="most choices per prompt a request may ask for (n, best_of) "
                             "(default: --max-num-seqs)")
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class DrainingServer(uvicorn.Server):
    """uvicorn that, on the first exit signal, drains before it stops."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining:          # a second signal: stop now
            return super().handle_exit(sig, frame)
        self.state.draining = True
        log.info("draining %d request(s) in flight", self.state.in_flight)
        asyncio.get_event_loop().create_task(self._drain(sig, frame))

    async def _drain(self, sig: int, frame) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.state.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        super().handle_exit(sig, frame)
        # A drained shutdown is a clean exit: uvicorn would re-raise the signal after it.
        self._captured_signals.clear()


def make_server(args: argparse.Namespace) -> tuple[DrainingServer, ServerState]:
    built = build_engine(args)
    compiling = warm_up(built)
    engine = AsyncEngine(built)
    spec = engine.engine.spec
    state = ServerState(engine, spec, args.served_model_name or spec.SPEC_NAME,
                        api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                        max_n=args.max_n, compile_process=compiling)
    config = uvicorn.Config(build_app(state), host=args.host, port=args.port,
                            log_level="info", timeout_graceful_shutdown=args.drain_timeout)
    return DrainingServer(config, state, args.drain_timeout), state


def warm_up(engine) -> subprocess.Popen | None:
    """Load every compiled graph there is; for the ones missing, serve eagerly while a
    background process compiles and saves them (the engine picks each up when saved).
    Returns that process, if one was started."""
    start = time.perf_counter()
    engine.warmup()
    pending = engine.pending_graphs()
    if pending:
        process = subprocess.Popen(precompile_command(engine.config))
        log.info("%d graph(s) are not compiled yet: compiling them in the background "
                 "(pid %d); they run eagerly meanwhile", pending, process.pid)
        return process
    if engine.graphs is not None:
        log.info("%d compiled graph(s) loaded in %.1f s", len(engine.graphs.seconds),
                 time.perf_counter() - start)
    return None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    server, state = make_server(args)
    state.engine.start()
    state.ready = True
    log.info("serving %s (spec %s) on http://%s:%d", state.model_name, state.spec.SPEC_PATH,
             args.host, args.port)
    try:
        server.run()
    finally:
        state.engine.shutdown()
        if state.compile_process is not None and state.compile_process.poll() is None:
            state.compile_process.terminate()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
