"""OutputStream: one body's outputs on their way from the thread that makes them (the
AsyncEngine's engine thread, or a CoreClient's receiver) to the event loop that reads
them (runtime/engine/client.py's `follow`).

    producer thread                              event loop
    put(output) ... put(output) -> wake? ---->  get(): every request's news since the
    fail(error)                                  last get, one output per request

Bounded whatever the reader does, and never a wait for the producer. An output for a
request that already has one pending is merged into it (RequestOutput deltas
concatenate: new ids, new text and log-probs add up; the later snapshot, finish and
error stand), so a body's stream holds at most one pending output per request, and a
client that stops reading (its socket full, its handler parked at a write: that is its
backpressure) holds pending no more than its requests generated meanwhile, which the
engine keeps anyway, in one object per request rather than one per step. Its requests
run on and end and free their blocks; nobody else waits for it. Text merges as a list
of pieces, joined once when read: a stream read after 10,000 steps costs O(its news).

The producer wakes the loop at most once between two reads: `put` says when this output
needs a wake-up, and the producer hands `wake` to the loop (batched per loop and step).
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field, replace

from runtime.engine.output_processor import RequestOutput


@dataclass(slots=True)
class _Merged:
    """Several outputs of one request not read yet, as one."""

    last: RequestOutput
    new_ids: list[int]
    text: list[str]                     # the new text's pieces, in order
    logprobs: list = field(default_factory=list)
    num_cached_tokens: int | None = None

    @classmethod
    def of(cls, first: RequestOutput) -> _Merged:
        return cls(first, list(first.new_ids), [first.new_text], list(first.logprobs),
                   first.num_cached_tokens)

    def add(self, out: RequestOutput) -> None:
        self.last = out
        self.new_ids += out.new_ids
        if out.new_text:
            self.text.append(out.new_text)
        self.logprobs += out.logprobs
        if self.num_cached_tokens is None:
            self.num_cached_tokens = out.num_cached_tokens

    def output(self) -> RequestOutput:
        cached = self.last.num_cached_tokens if self.last.num_cached_tokens is not None \
            else self.num_cached_tokens
        return replace(self.last, new_ids=self.new_ids, new_text="".join(self.text),
                       logprobs=self.logprobs, num_cached_tokens=cached)


class OutputStream:
    """The pending outputs of one body's requests (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: dict[str, RequestOutput | _Merged] = {}    # in arrival order
        self._failure: BaseException | None = None
        self._waiter: asyncio.Future | None = None    # the reader's, while it waits
        self._woken = False                           # a wake-up is on its way

    # -- the producer (any thread) ---------------------------------------------------

    def put(self, output: RequestOutput) -> bool:
        """Add a request's output (merged into the one pending, if any); True if the
        reader must be woken: hand `wake` to the loop then."""
        with self._lock:
            held = self._pending.get(output.request_id)
            if held is None:
                self._pending[output.request_id] = output
            elif isinstance(held, _Merged):
                held.add(output)
            else:
                merged = self._pending[output.request_id] = _Merged.of(held)
                merged.add(output)
            return self._arm()

    def fail(self, error: BaseException) -> bool:
        """End the stream with `error` (a refusal, a request's failure, the engine's);
        the first one stands. True if the reader must be woken."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            return self._arm()

    def _arm(self) -> bool:
        if self._waiter is None or self._woken:
            return False
        self._woken = True
        return True

    def pending(self) -> int:
        """Requests with an output not read yet (at most the body's requests)."""
        with self._lock:
            return len(self._pending)

    # -- the reader (the event loop) -------------------------------------------------

    def wake(self) -> None:
        """On the loop: the reader waiting in `get` goes on."""
        with self._lock:
            waiter, self._waiter, self._woken = self._waiter, None, False
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> list[RequestOutput]:
        """Every output pending, one per request (waiting for one if there is none);
        raises the stream's failure."""
        while True:
            with self._lock:
                if self._failure is not None:
                    raise self._failure
                if self._pending:
                    taken, self._pending = self._pending, {}
                    break
                waiter = self._waiter = self.loop.create_future()
            await waiter
        return [held.output() if isinstance(held, _Merged) else held
                for held in taken.values()]


def wake_all(streams: list[OutputStream]) -> None:
    """On a loop: wake each stream (a producer's one call per loop and step)."""
    for stream in streams:
        stream.wake()
