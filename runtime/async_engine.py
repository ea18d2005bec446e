"""The engine behind an asyncio server: a thread runs the step loop; callers stream.

    engine = AsyncEngine(Engine.build(config)); engine.start()
    async for output in engine.generate(prompt_ids, params, request_id): ...

Cancelling the consumer (a client that went away) aborts the request, which frees its
blocks and MTP slot. If a step raises, the engine is dead: every stream in flight and
every later call gets EngineDeadError, and `healthy` turns False.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from runtime.engine import Engine, RequestOutput
from runtime.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Condition()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread = threading.Thread(target=self._loop, name="v4serve-engine", daemon=True)
        self._stopping = False
        self.error: BaseException | None = None

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout=30)

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; ValueError if it can never run."""
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self.error is not None:
                raise EngineDeadError(f"the engine stopped: {self.error}")
            self.engine.add_request(prompt, params, request_id)
            self._streams[request_id] = (asyncio.get_running_loop(), queue)
            self._lock.notify()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine stopped: {item}") from item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)

    def run_locked(self, fn, *args):
        """Run fn(engine, *args) between steps (metrics, inspection)."""
        with self._lock:
            return fn(self.engine, *args)

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self.engine.has_unfinished():
                        self._lock.wait()
                    if self._stopping:
                        return
                    outputs = self.engine.step()
                    self._deliver(outputs)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the callers
            with self._lock:
                self.error = exc
                for loop, queue in self._streams.values():
                    loop.call_soon_threadsafe(queue.put_nowait, exc)
                self._streams.clear()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            target = self._streams.get(output.request_id)
            if target is None:
                continue
            loop, queue = target
            loop.call_soon_threadsafe(queue.put_nowait, output)
            if output.finished:
                del self._streams[output.request_id]
