"""EngineClient: the engine as the API server holds it, whichever way it runs.

    AsyncEngine (runtime/engine/async_engine.py)   kind "thread": an Engine stepped on a
                                                  thread of the server's process
    CoreClient  (runtime/process/core_client.py)   kind "process": an engine core process
                                                  fed over ZMQ

The server reads nothing else of either (tests/runtime/test_engine_client.py checks that
both declare every member and nothing public beyond it but their own listed extras); a
new way to run the engine is a new class with this surface, not a probe in the server.

Both stream a request's outputs through `consume`, so failures read the same: a request
the engine refuses raises ValueError (InvalidParam naming the field); one whose own
processing fails raises RequestFailedError; when the shared step fails every stream in
flight and every later call raise EngineDeadError.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.core.sampling_params import SamplingParams
    from runtime.engine.output_processor import RequestOutput
    from runtime.planning.admission import Admission
    from runtime.text.tokenizer import Tokenizer


class EngineDeadError(RuntimeError):
    """The shared step failed; the engine serves nobody any more."""


class RequestFailedError(RuntimeError):
    """One request's own processing failed; the engine goes on."""


class EngineClient(Protocol):
    kind: str                     # "thread" | "process": where the step loop runs
    tokenizer: Tokenizer | None   # the checkpoint's (None: the server takes token ids only)
    admission: Admission          # limits and checks, the same as the engine applies

    @property
    def pid(self) -> int | None:
        """The process that runs the step loop (None before a core process is started)."""
        ...

    @property
    def ready(self) -> bool:
        """Loaded and warmed up: requests are taken."""
        ...

    @property
    def healthy(self) -> bool:
        """Ready, and the step loop has not failed."""
        ...

    @property
    def num_in_flight(self) -> int:
        """Requests streaming now."""
        ...

    def start(self) -> None:
        """Start the step loop (a core process loads in the background: see `ready`)."""
        ...

    def shutdown(self) -> None:
        """Stop the step loop (it finishes the step it is in)."""
        ...

    def summary(self) -> dict:
        """What was loaded and how much fits (Engine.summary; empty before ready)."""
        ...

    def snapshot(self) -> dict | None:
        """Counters and gauges for /metrics (Engine.snapshot; None before ready)."""
        ...

    def generate(self, prompt: list[int], params: SamplingParams,
                 request_id: str) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs (see the module docstring for what it raises)."""
        ...

    def abort(self, request_id: str) -> None:
        """End a request in flight and free what it holds; its stream ends."""
        ...


async def consume(queue: asyncio.Queue, request_id: str,
                  abort: Callable[[str], None]) -> AsyncIterator[RequestOutput]:
    """A request's outputs from the queue its client fills: RequestOutputs, then the end;
    or a refusal (ValueError), its own failure (RequestFailedError, or an output with an
    error) or the engine's (any other exception: EngineDeadError). A consumer that stops
    early aborts the request."""
    finished = False
    try:
        while not finished:
            item = await queue.get()
            if isinstance(item, ValueError | RequestFailedError):
                finished = True
                raise item
            if isinstance(item, BaseException):
                raise EngineDeadError(f"the engine stopped: {item}") from item
            finished = item.finished
            if item.error is not None:
                raise RequestFailedError(f"request {request_id} failed: {item.error}")
            yield item
    finally:
        if not finished:
            abort(request_id)
