"""EngineClient: the engine as the API server holds it, whichever way it runs.

    AsyncEngine (runtime/engine/async_engine.py)   kind "thread": an Engine stepped on a
                                                  thread of the server's process
    CoreClient  (runtime/process/core_client.py)   kind "process": an engine core process
                                                  fed over ZMQ

The server reads nothing else of either (tests/runtime/test_engine_client.py checks that
both declare every member and nothing public beyond it but their own listed extras); a
new way to run the engine is a new class with this surface, not a probe in the server.

The unit is a body (one HTTP request: its prompts x n): `stream` sends its prompts once
and a Choice per engine request (runtime/engine/intake.py's Add), and yields its outputs
a batch at a time from one OutputStream (runtime/engine/output_stream.py: bounded, the
news of a request the reader has not taken merged into one output). Both clients follow
a body through `follow`, so failures read the same: a request the engine refuses raises
ValueError (InvalidParam naming the field); one whose own processing fails raises
RequestFailedError; when the shared step fails every stream in flight and every later
call raise EngineDeadError. Each ends the body's stream, and what is unfinished of the
body is aborted in one message.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.core.sampling_params import SamplingParams
    from runtime.engine.output_processor import RequestOutput
    from runtime.engine.output_stream import OutputStream
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

    def generate(self, prompt: list[int], params: SamplingParams, request_id: str,
                 group: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs (a body of one: see `stream`)."""
        ...

    def stream(self, body: object) -> AsyncIterator[list[RequestOutput]]:
        """Stream a body's outputs (`body`: an intake.Add, untyped here: intake imports
        this module), a batch at a time: each request's news since the
        last batch as one output (see the module docstring for what it raises)."""
        ...

    def abort(self, request_id: str) -> None:
        """End a request in flight and free what it holds; its stream ends."""
        ...


async def follow(stream: OutputStream, request_ids: list[str],
                 abort: Callable[[list[str]], None]) -> AsyncIterator[list[RequestOutput]]:
    """A body's outputs from the stream its client fills, a batch at a time, until
    each request has finished; or a refusal (ValueError), a request's own failure
    (RequestFailedError, or an output with an error) or the engine's (any other
    exception: EngineDeadError). A consumer that stops early aborts what is unfinished,
    in one call."""
    live = set(request_ids)
    try:
        while live:
            try:
                batch = await stream.get()
            except (ValueError, RequestFailedError, asyncio.CancelledError):
                raise
            except BaseException as exc:  # noqa: BLE001 - the engine's failure
                live.clear()
                raise EngineDeadError(f"the engine stopped: {exc}") from exc
            for out in batch:
                if out.finished:
                    live.discard(out.request_id)
                if out.error is not None:
                    raise RequestFailedError(f"request {out.request_id} failed: {out.error}")
            yield batch
    finally:
        if live:
            abort(list(live))


async def single(batches: AsyncIterator[list[RequestOutput]]) -> AsyncIterator[RequestOutput]:
    """A body of one request's batches as that request's outputs."""
    async with aclosing(batches):
        async for batch in batches:
            for out in batch:
                yield out
