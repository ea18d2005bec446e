"""The engine behind an asyncio server: a thread runs the step loop; callers stream.

    engine = AsyncEngine(Engine.build(config)); engine.start()
    async for output in engine.generate(prompt_ids, params, request_id): ...

The event loop never waits for a step: new requests and aborts go through one queue (the
intake's messages, runtime/engine/intake.py) that the engine thread drains between
steps. Cancelling the consumer (a client that went away) aborts the request, which frees
its blocks and MTP slot.

Failures are sorted by whose they are (runtime/engine/client.py): a request the engine
refuses raises ValueError in its stream; a request whose own processing fails (sampling,
detokenization, a stop check) raises RequestFailedError in its stream alone, and
everyone else goes on. Only a failure of the shared step (a kernel, the pools, the
scheduler) kills the engine: every stream in flight and every later call gets
EngineDeadError.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import AsyncIterator

from runtime.core.sampling_params import SamplingParams
from runtime.engine.client import EngineClient, EngineDeadError, consume
from runtime.engine.engine import Engine
from runtime.engine.intake import Abort, Add, take
from runtime.engine.output_processor import RequestOutput


class AsyncEngine(EngineClient):
    """The EngineClient of an Engine stepped on a thread of this process."""

    kind = "thread"

    def __init__(self, engine: Engine):
        self.engine = engine
        self._step_lock = threading.Lock()      # held by the engine thread for each step
        self._wake = threading.Event()
        self._incoming: deque[Add | Abort] = deque()   # the engine thread takes, in order
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread = threading.Thread(target=self._loop, name="v4serve-engine", daemon=True)
        self._stopping = False
        self.error: BaseException | None = None

    # -- the EngineClient surface ----------------------------------------------------

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def admission(self):
        return self.engine.admission

    def summary(self) -> dict:
        return self.engine.summary()

    def snapshot(self) -> dict:
        """The engine's counters and gauges, read between two steps."""
        return self.run_locked(lambda engine: engine.snapshot())

    @property
    def ready(self) -> bool:
        return True             # built before the server starts

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. ValueError if the engine refuses it."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped: {self.error}")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        self._incoming.append(Add(request_id, prompt, params))
        self._wake.set()
        async for item in consume(queue, request_id, self.abort):
            yield item

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._incoming.append(Abort([request_id]))
        self._wake.set()

    def run_locked(self, fn, *args):
        """Run fn(engine, *args) between steps, after every request and abort queued so
        far is applied (metrics, inspection); blocks the caller for at most one step, so
        call it from a worker thread, not the event loop."""
        with self._step_lock:
            self._take_requests()
            return fn(self.engine, *args)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                with self._step_lock:
                    self._take_requests()
                    busy = self.engine.has_unfinished()
                    if busy:
                        self._deliver(self.engine.step())
                if not busy:
                    self._wake.wait()
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the callers
            self.error = exc
            for loop, queue in list(self._streams.values()):
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            self._streams.clear()

    def _take_requests(self) -> None:
        while self._incoming:
            message = self._incoming.popleft()
            if isinstance(message, Add) and message.request_id not in self._streams:
                continue                               # cancelled before it started
            refused = take(self.engine, message)
            if refused is not None:
                self._send(refused.request_id, refused.error())
                self._streams.pop(refused.request_id, None)

    def _send(self, request_id: str, item: object) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, queue = target
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:                           # its event loop is gone: abort it
            self.abort(request_id)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            self._send(output.request_id, output)
            if output.finished:
                self._streams.pop(output.request_id, None)
