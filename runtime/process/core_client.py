"""CoreClient: the engine core process as the API server sees it, with the surface of
AsyncEngine (generate, abort, admission, snapshot, healthy), so the server runs on
either.

The client starts the core (`python -m runtime.process.engine_core`), sends it requests and
aborts, and turns each Step it pushes into RequestOutputs: the incremental
detokenization and the stop strings happen here, in the server process; a stop string
found aborts the request in the core. A receiver thread reads the core's pipe and
watches the process: when the core dies (or reports Dead), every request in flight gets
EngineDeadError within a poll interval, `healthy` turns false and stays false.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import zmq

import generated
from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.device.model_runner import TokenLogprobs
from runtime.engine.async_engine import EngineDeadError, RequestFailedError, consume
from runtime.engine.detokenizer import Detokenizer
from runtime.engine.engine import EngineConfig, RequestOutput
from runtime.engine.tokenizer import Tokenizer
from runtime.planning.admission import Admission
from runtime.process.core_messages import (
    Abort,
    Add,
    Dead,
    Delta,
    FromCore,
    Ready,
    Refused,
    Shutdown,
    Step,
)

log = logging.getLogger("v4serve.core")
POLL_MS = 100           # the receiver notices a dead core within this


@dataclasses.dataclass
class _Stream:
    """A request in flight: where its outputs go, and its text so far."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt_ids: list[int]
    detok: Detokenizer | None
    output_ids: list[int] = dataclasses.field(default_factory=list)


class CoreClient:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.spec = generated.load(config.spec)
        self.admission = Admission.plan(config, self.spec)    # ConfigError before spawning
        model = Path(config.model)
        self.tokenizer = Tokenizer(model) if (model / "tokenizer.json").exists() else None
        self.process: subprocess.Popen | None = None
        self.on_ready: Callable[[dict], None] | None = None
        self.on_dead: Callable[[str], None] | None = None      # also before it was ready
        self.error: str | None = None
        self._summary: dict | None = None
        self._snapshot: dict | None = None
        self._streams: dict[str, _Stream] = {}
        self._send_lock = threading.Lock()
        self._stopping = False
        self._encoder = msgspec.msgpack.Encoder()
        self._folder = tempfile.TemporaryDirectory(prefix="v4serve-core-")
        self._context = zmq.Context()
        self._to_core = self._context.socket(zmq.PUSH)
        self._to_core.setsockopt(zmq.SNDHWM, 0)       # queue without limit, never block
        self._from_core = self._context.socket(zmq.PULL)
        self._receiver = threading.Thread(target=self._receive, name="v4serve-core-client",
                                          daemon=True)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the core; it loads (and warms up) in the background: `ready` turns true
        and `on_ready(summary)` runs when it has."""
        to_core, from_core = (f"ipc://{self._folder.name}/{n}" for n in ("in", "out"))
        self._to_core.bind(to_core)
        self._from_core.bind(from_core)
        config = {k: str(v) if isinstance(v, Path) else v
                  for k, v in dataclasses.asdict(self.config).items()}
        config["detokenize"] = False
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runtime.process.engine_core", "--config", json.dumps(config),
             "--input", to_core, "--output", from_core, "--parent", str(os.getpid())],
            start_new_session=True)     # a Ctrl-C at the terminal is the server's to handle
        self._receiver.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core (it finishes the step it is in), then the receiver."""
        self._stopping = True
        if self.process is not None and self.process.poll() is None:
            try:
                self._send(Shutdown())
            except EngineDeadError:
                self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._receiver.is_alive():
            self._receiver.join(timeout=5)
        self._context.destroy(linger=0)
        self._folder.cleanup()

    @property
    def ready(self) -> bool:
        return self._summary is not None

    @property
    def healthy(self) -> bool:
        return self.ready and self.error is None and self.process.poll() is None

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def summary(self) -> dict:
        return self._summary or {}

    def snapshot(self) -> dict | None:
        """The counters and gauges the core sent with its latest step (None before it
        is ready)."""
        return self._snapshot

    # -- requests --------------------------------------------------------------------

    async def generate(self, prompt: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs, as AsyncEngine.generate does."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped: {self.error}")
        if not self.ready:
            raise EngineDeadError("the engine is still loading")
        detok = Detokenizer(self.tokenizer, params.stop) if self.tokenizer else None
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = _Stream(asyncio.get_running_loop(), queue, list(prompt),
                                            detok)
        try:
            self._send(Add(request_id, list(prompt), params))
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        async for item in consume(queue, request_id, self.abort):
            yield item

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._abort_in_core(request_id)

    def _abort_in_core(self, request_id: str) -> None:
        if self.error is None:
            try:
                self._send(Abort([request_id]))
            except EngineDeadError:
                pass                     # the core is gone: nothing left to free

    def _send(self, message) -> None:
        """Queue a message for the core without ever blocking (no high-water mark; only a
        core that is not connected refuses it: EngineDeadError)."""
        with self._send_lock:            # the event loop and the receiver both send
            try:
                self._to_core.send(self._encoder.encode(message), zmq.NOBLOCK, copy=False)
            except zmq.Again:
                raise EngineDeadError("the engine core is not reachable") from None

    # -- the receiver thread ---------------------------------------------------------

    def _receive(self) -> None:
        decoder = msgspec.msgpack.Decoder(FromCore)
        poller = zmq.Poller()
        poller.register(self._from_core, zmq.POLLIN)
        while not self._stopping:
            if poller.poll(POLL_MS):
                message = decoder.decode(self._from_core.recv(copy=False))
                if isinstance(message, Step):
                    self._step(message)
                elif isinstance(message, Ready):
                    self._ready(message)
                elif isinstance(message, Dead):
                    self._die(message.error)
            elif self.process.poll() is not None and not self._stopping:
                self._die(f"the engine core exited with code {self.process.returncode}")
            if self.error is not None:
                return

    def _ready(self, message: Ready) -> None:
        self._summary, self._snapshot = message.summary, message.snapshot
        if self.on_ready is not None:
            self.on_ready(message.summary)

    def _step(self, message: Step) -> None:
        """Every output of the step handed to the event loop in one wake-up."""
        self._snapshot = message.snapshot
        batch = [(s, self._refusal(r)) for r in message.refused
                 if (s := self._streams.pop(r.request_id, None)) is not None]
        batch += [(s, self._output(d.request_id, s, d)) for d in message.deltas
                  if (s := self._streams.get(d.request_id)) is not None]
        loops: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, item in batch:
            loops.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, items in loops.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:                        # its event loop is gone
                for stream, item in batch:
                    if stream.loop is loop and isinstance(item, RequestOutput) \
                            and not item.finished:
                        self.abort(item.request_id)

    @staticmethod
    def _refusal(refused: Refused) -> Exception:
        if not refused.client_error:
            return RequestFailedError(f"request {refused.request_id} failed: "
                                      f"{refused.message}")
        return InvalidParam(refused.param, refused.message) if refused.param \
            else ValueError(refused.message)

    def _output(self, request_id: str, stream: _Stream, delta: Delta) -> RequestOutput:
        """One step's tokens as a RequestOutput: text released, stop strings applied (a
        stop ends the request here and aborts it in the core)."""
        stream.output_ids += delta.new_ids
        finished, reason, stop_reason = delta.finished, delta.finish_reason, delta.stop_reason
        new_text, text = "", ""
        try:
            if stream.detok is not None and delta.error is None:
                new_text, stop = stream.detok.add(delta.new_ids)
                if stop is not None and not finished:
                    finished, reason, stop_reason = True, "stop", stop
                    self._abort_in_core(request_id)
                elif finished:
                    new_text += stream.detok.flush()
                text = stream.detok.text
            error = delta.error
        except Exception as exc:  # noqa: BLE001 - this request's failure alone
            finished, reason, error = True, "error", f"{type(exc).__name__}: {exc}"
            if not delta.finished:
                self._abort_in_core(request_id)
        logprobs = [TokenLogprobs(t, lp, [tuple(x) for x in top])
                    for t, lp, top in delta.logprobs]
        if finished:
            self._streams.pop(request_id, None)
        return RequestOutput(request_id, stream.prompt_ids, list(stream.output_ids), text,
                             list(delta.new_ids), new_text, finished, reason, stop_reason,
                             logprobs, error, delta.num_cached_tokens)

    def _die(self, error: str) -> None:
        """The core is gone: every request in flight and every later one fails."""
        self.error = error
        log.error("the engine core failed: %s", error)
        if self.on_dead is not None:
            self.on_dead(error)
        failure = RuntimeError(error)
        for stream in list(self._streams.values()):
            _put(stream, failure)
        self._streams.clear()


def _put(stream: _Stream, item: object) -> bool:
    """Hand `item` to the stream's event loop; False if that loop is gone."""
    try:
        stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        return True
    except RuntimeError:
        return False


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    """On the event loop: every (queue, item) of one step."""
    for queue, item in items:
        queue.put_nowait(item)
