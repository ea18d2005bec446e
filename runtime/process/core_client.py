"""CoreClient: the engine core process as the API server sees it, an EngineClient
(runtime/engine/client.py) as AsyncEngine is, so the server runs on either.

The client starts the core (`python -m runtime.process.engine_core`), sends it bodies (one
Add each: the prompts once, a Choice per request) and aborts (one message per body), and
turns each Step it pushes into RequestOutputs with its OutputProcessor: the incremental
detokenization and the stop strings happen here, in the server process; an output the
processor ended (a stop string) is aborted in the core. A receiver thread reads the
core's pipe and watches the process: when the core dies (or reports Dead), every
request in flight gets EngineDeadError within a poll interval, `healthy` turns false
and stays false. The receiver hands outputs to each body's OutputStream
(runtime/engine/output_stream.py), which never blocks it: a body whose reader does not
keep up has its news merged, one pending output per request.
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
from runtime.core.config import EngineConfig
from runtime.core.sampling_params import SamplingParams
from runtime.engine.client import EngineClient, EngineDeadError, follow, single
from runtime.engine.output_processor import OutputProcessor, RequestOutput
from runtime.engine.output_stream import OutputStream, wake_all
from runtime.planning.admission import Admission
from runtime.process.core_messages import (
    Abort,
    Add,
    Choice,
    Dead,
    FromCore,
    Ready,
    Shutdown,
    Step,
)
from runtime.text.tokenizer import Tokenizer

log = logging.getLogger("v4serve.core")
POLL_MS = 100           # the receiver notices a dead core within this


class CoreClient(EngineClient):
    """The EngineClient of an engine core process."""

    kind = "process"

    def __init__(self, config: EngineConfig):
        self.config = config
        self.spec = generated.load(config.spec)
        self.admission = Admission.plan(config, self.spec)    # ConfigError before spawning
        model = Path(config.model)
        self.tokenizer = Tokenizer(model) if (model / "tokenizer.json").exists() else None
        # written by the event loop (add, abort) and the receiver (outputs, refusals)
        self._processor = OutputProcessor(self.tokenizer)
        self.process: subprocess.Popen | None = None
        self.on_ready: Callable[[dict], None] | None = None
        self.on_dead: Callable[[str], None] | None = None      # also before it was ready
        self.error: str | None = None
        self._summary: dict | None = None
        self._snapshot: dict | None = None
        # request id -> its body's stream (its text: the output processor's), until its
        # last output; written by the event loop (add, abort) and the receiver (ends)
        self._streams: dict[str, OutputStream] = {}
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
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

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

    async def generate(self, prompt: list[int], params: SamplingParams, request_id: str,
                       group: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs, as AsyncEngine.generate does."""
        async for out in single(self.stream(Add([prompt], params, [Choice(request_id, 0)],
                                                group))):
            yield out

    async def stream(self, body: Add) -> AsyncIterator[list[RequestOutput]]:
        """Stream a body's outputs, a batch at a time (EngineClient.stream): its prompts
        go to the core once, in one message with its choices."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped: {self.error}")
        if not self.ready:
            raise EngineDeadError("the engine is still loading")
        stream = OutputStream(asyncio.get_running_loop())
        ids = [choice.request_id for choice in body.choices]
        for choice in body.choices:       # the prompt lists are shared, never copied
            self._streams[choice.request_id] = stream
            self._processor.add(choice.request_id, body.prompts[choice.prompt],
                                body.params.stop)
        try:
            self._send(body)
        except BaseException:
            for request_id in ids:
                self._end(request_id)
            raise
        async for batch in follow(stream, ids, self._abort):
            yield batch

    def abort(self, request_id: str) -> None:
        self._abort([request_id])

    def _abort(self, request_ids: list[str]) -> None:
        """End these requests here and in the core (one message, however many)."""
        ended = [request_id for request_id in request_ids if self._end(request_id) is not None]
        if ended:
            self._abort_in_core(ended)

    def _end(self, request_id: str) -> OutputStream | None:
        """Stop following a request: its stream, if it still had one."""
        self._processor.forget(request_id)
        return self._streams.pop(request_id, None)

    def _abort_in_core(self, request_ids: list[str]) -> None:
        if self.error is None:
            try:
                self._send(Abort(request_ids))
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
        """Every output of the step handed to its body's stream, the readers woken with
        one call per event loop."""
        self._snapshot = message.snapshot
        woken = [stream for r in message.refused
                 if (stream := self._end(r.request_id)) is not None and stream.fail(r.error())]
        woken += [stream for stream, out in self._outputs(message) if stream.put(out)]
        loops: dict[asyncio.AbstractEventLoop, list[OutputStream]] = {}
        for stream in woken:
            loops.setdefault(stream.loop, []).append(stream)
        for loop, streams in loops.items():
            try:
                loop.call_soon_threadsafe(wake_all, streams)
            except RuntimeError:                        # its event loop is gone: abort
                gone = set(streams)
                self._abort([rid for rid, s in list(self._streams.items()) if s in gone])

    def _outputs(self, message: Step) -> list[tuple[OutputStream, RequestOutput]]:
        """The step's RequestOutputs with their streams. One the processor ended (a stop
        string; its text failed) still runs in the core: abort it there."""
        ended_in_core = {d.request_id for d in message.deltas if d.finished}
        stopped, batch = [], []
        for out in self._processor.process(message.deltas):
            if out.finished and out.request_id not in ended_in_core:
                stopped.append(out.request_id)
            stream = self._end(out.request_id) if out.finished \
                else self._streams.get(out.request_id)
            if stream is not None:
                batch.append((stream, out))
        if stopped:
            self._abort_in_core(stopped)
        return batch

    def _die(self, error: str) -> None:
        """The core is gone: every request in flight and every later one fails."""
        self.error = error
        log.error("the engine core failed: %s", error)
        if self.on_dead is not None:
            self.on_dead(error)
        failure = RuntimeError(error)
        streams = {stream for request_id in list(self._streams)
                   if (stream := self._end(request_id)) is not None}   # not aborted meanwhile
        for stream in streams:
            if stream.fail(failure):
                try:
                    stream.loop.call_soon_threadsafe(stream.wake)
                except RuntimeError:
                    pass                                # its event loop is gone
