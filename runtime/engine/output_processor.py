"""OutputProcessor: the one home of detokenization, stop strings and RequestOutputs.

    step -> [Delta] (token ids, the scheduler's finish) -> OutputProcessor -> [RequestOutput]

An engine step yields a Delta per request it advanced: the token ids it kept and whether
the scheduler ended the request (EOS, a stop token, a length). The processor turns each
into a RequestOutput: the request's text grown incrementally (a Detokenizer each), a stop
string ending it, the output ids so far. An output the processor ended (a stop string, or
its own text failing) must end where the request runs: the in-process Engine finishes it
in its scheduler, the CoreClient sends its core an Abort.

An output is a snapshot made in O(new tokens), whatever the output's length: its
`output_ids` a view of the request's append-only id list (IdsSnapshot), its `text` a view
of the detokenizer's append-only released text (TextSnapshot), joined when first read.
Neither changes when later steps append; nothing copies the ids or the text so far.

The Engine runs one over its own steps (without a tokenizer in an engine core process:
ids only); the CoreClient runs one over the Deltas its core sends.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from runtime.device.step_result import TokenLogprobs
from runtime.engine.ids_snapshot import IdsSnapshot
from runtime.text.detokenizer import Detokenizer
from runtime.text.growing_text import EMPTY, TextSnapshot
from runtime.text.tokenizer import Tokenizer

log = logging.getLogger("v4serve.engine")


@dataclass(slots=True)
class RequestOutput:
    """One step's news of a request, and everything so far as of that step."""

    request_id: str
    prompt_ids: list[int]            # the list given to add (shared, not copied)
    output_ids: IdsSnapshot          # every token so far (a read-only list)
    new_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)   # of new_ids
    error: str | None = None         # the request failed (finish_reason "error"); why
    num_cached_tokens: int | None = None   # prompt tokens found in the prefix cache
    released: TextSnapshot = field(default_factory=lambda: EMPTY, repr=False)  # as `text`

    @property
    def text(self) -> str:
        """Every released character so far (joined on first read, O(length) once)."""
        return str(self.released)


class Delta(msgspec.Struct, array_like=True):
    """What one step produced for one request, as ids (an engine core sends these):
    `error` set ends the request with finish_reason "error" (the engine logged why)."""

    request_id: str
    new_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] = []        # of new_ids
    error: str | None = None
    num_cached_tokens: int | None = None


@dataclass
class _Tracked:
    """One request's output so far."""

    prompt_ids: list[int]
    stop: tuple[str, ...]
    # made at the request's first delta (a body of 16k requests costs its adder a dict
    # entry each; their detokenizers come as their outputs do); None: not yet, or no
    # tokenizer here (ids only)
    detok: Detokenizer | None = None
    # append-only: the outputs made so far are views of its first ids
    output_ids: list[int] = field(default_factory=list)


class OutputProcessor:
    """Tracks a request from `add` until its output finishes (or `forget`). Another
    thread may forget a request at any time, a `process` call included (a client's
    abort): each Delta reads its request's state once, and one whose request is gone is
    dropped."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer = tokenizer
        self._tracked: dict[str, _Tracked] = {}

    def add(self, request_id: str, prompt_ids: list[int], stop: tuple[str, ...] = ()) -> None:
        """Track a request (O(1): its prompt list is shared, not copied)."""
        self._tracked[request_id] = _Tracked(prompt_ids, stop)

    def forget(self, request_id: str) -> None:
        """Stop tracking a request that ended elsewhere (aborted, refused)."""
        self._tracked.pop(request_id, None)

    def process(self, deltas: Iterable[Delta]) -> list[RequestOutput]:
        """One RequestOutput per Delta of a tracked request, in order. A request whose
        text fails ends alone, with an error output."""
        return [self._output(tracked, delta) for delta in deltas
                if (tracked := self._tracked.get(delta.request_id)) is not None]

    def _output(self, tracked: _Tracked, delta: Delta) -> RequestOutput:
        tracked.output_ids += delta.new_ids
        out = self._text(tracked, delta) if delta.error is None \
            else _failed(delta.request_id, tracked, delta.error, delta.num_cached_tokens)
        if out.finished:
            self.forget(out.request_id)
        return out

    def _text(self, tracked: _Tracked, delta: Delta) -> RequestOutput:
        out = RequestOutput(delta.request_id, tracked.prompt_ids,
                            IdsSnapshot(tracked.output_ids), delta.new_ids, "",
                            delta.finished, delta.finish_reason,
                            delta.stop_reason, delta.logprobs,
                            num_cached_tokens=delta.num_cached_tokens)
        if self.tokenizer is not None:
            try:
                if tracked.detok is None:
                    tracked.detok = Detokenizer(self.tokenizer, tracked.stop)
                _release(tracked.detok, out)
            except Exception as exc:  # noqa: BLE001 - isolated to this request
                _log_failure(delta.request_id, exc)
                return _failed(delta.request_id, tracked, _describe(exc),
                               delta.num_cached_tokens)
        return out


def _release(detok: Detokenizer, out: RequestOutput) -> None:
    """The text the output's new ids release. A stop string found ends the output, before
    the string; an output the scheduler ended in this step releases everything held back
    (a stop string in it included: the scheduler's reason stands)."""
    out.new_text, stop = detok.add(out.new_ids)
    if stop is not None and not out.finished:
        out.finished, out.finish_reason, out.stop_reason = True, "stop", stop
    elif out.finished:
        out.new_text += detok.flush()
    out.released = detok.released.snapshot()


def _failed(request_id: str, tracked: _Tracked, error: str,
            num_cached_tokens: int | None) -> RequestOutput:
    """A failed request's last output: its ids so far, no text, finish_reason "error"."""
    return RequestOutput(request_id, tracked.prompt_ids, IdsSnapshot(tracked.output_ids), [],
                         "", True, "error", error=error, num_cached_tokens=num_cached_tokens)


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _log_failure(request_id: str, error: Exception) -> None:
    log.error("request %s failed: %s", request_id, _describe(error), exc_info=error)
