"""The memory a call allocates, counted deterministically rather than timed: tracemalloc's
peak of the bytes Python holds during the call, over what it held before. A step that
copied the ids or the text so far would show that copy's size here."""
from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def tracing() -> Iterator[None]:
    """Trace Python's allocations within the block (unless something already traces)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


def peak_bytes(call: Callable[[], object]) -> int:
    """The most bytes `call()` held at once beyond what was held before it (within
    `tracing()`)."""
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    call()
    return tracemalloc.get_traced_memory()[1] - before
