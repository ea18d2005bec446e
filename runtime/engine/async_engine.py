"""The engine behind an asyncio server: a thread runs the step loop; callers stream.

    engine = AsyncEngine(Engine.build(config)); engine.start()
    async for output in engine.generate(prompt_ids, params, request_id): ...

The event loop never waits for a step: new bodies and aborts go through one queue that
the engine thread drains between steps into its Intake (runtime/engine/intake.py),
which adds a step's share of the requests sent; outputs go back through each body's
OutputStream (runtime/engine/output_stream.py: bounded, whether or not its reader
keeps up). Cancelling the consumer (a client that went away) aborts what is unfinished
of its body, which frees its blocks and MTP slots.

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
from runtime.engine.client import EngineClient, EngineDeadError, follow, single
from runtime.engine.engine import Engine
from runtime.engine.intake import Abort, Add, Choice, Intake
from runtime.engine.output_processor import RequestOutput
from runtime.engine.output_stream import OutputStream, wake_all


class AsyncEngine(EngineClient):
    """The EngineClient of an Engine stepped on a thread of this process."""

    kind = "thread"

    def __init__(self, engine: Engine):
        self.engine = engine
        self._step_lock = threading.Lock()      # held by the engine thread for each step
        self._wake = threading.Event()
        self._incoming: deque[Add | Abort] = deque()   # the engine thread takes, in order
        limits = engine.admission.limits
        self._intake = Intake(engine, limits.max_num_seqs, limits.max_num_batched_tokens)
        # request id -> its body's stream, from `stream` until its last output is sent
        self._streams: dict[str, OutputStream] = {}
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
                       request_id: str, group: str | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. ValueError if the engine refuses it."""
        async for out in single(self.stream(Add([prompt], params, [Choice(request_id, 0)],
                                                group))):
            yield out

    async def stream(self, body: Add) -> AsyncIterator[list[RequestOutput]]:
        """Stream a body's outputs, a batch at a time (EngineClient.stream)."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped: {self.error}")
        stream = OutputStream(asyncio.get_running_loop())
        ids = [choice.request_id for choice in body.choices]
        self._streams.update(dict.fromkeys(ids, stream))
        self._incoming.append(body)
        self._wake.set()
        async for batch in follow(stream, ids, self._abort):
            yield batch

    def abort(self, request_id: str) -> None:
        self._abort([request_id])

    def _abort(self, request_ids: list[str]) -> None:
        """End these requests (one message, however many)."""
        for request_id in request_ids:
            self._streams.pop(request_id, None)
        self._incoming.append(Abort(request_ids))
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
                    self._refuse(self._intake.admit())
                    busy = self.engine.has_unfinished()
                    if busy:
                        self._deliver(self.engine.step())
                if not (busy or self._intake.pending):
                    self._wake.wait()
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the callers
            self.error = exc
            streams = set(self._streams.values())
            self._streams.clear()
            self._hand(stream for stream in streams if stream.fail(exc))

    def _take_requests(self) -> None:
        while self._incoming:
            self._intake.put(self._incoming.popleft())

    def _refuse(self, refused) -> None:
        woken = []
        for refusal in refused:
            stream = self._streams.pop(refusal.request_id, None)
            if stream is not None and stream.fail(refusal.error()):
                woken.append(stream)
        self._hand(woken)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        woken = []
        for output in outputs:
            stream = self._streams.pop(output.request_id, None) if output.finished \
                else self._streams.get(output.request_id)
            if stream is not None and stream.put(output):
                woken.append(stream)
        self._hand(woken)

    def _hand(self, streams) -> None:
        """Wake the readers of these streams: one call per event loop."""
        loops: dict[asyncio.AbstractEventLoop, list[OutputStream]] = {}
        for stream in streams:
            loops.setdefault(stream.loop, []).append(stream)
        for loop, woken in loops.items():
            try:
                loop.call_soon_threadsafe(wake_all, woken)
            except RuntimeError:                       # its event loop is gone: abort
                gone = set(woken)
                self._abort([rid for rid, s in list(self._streams.items()) if s in gone])
