"""Intake: the requests and aborts an engine takes between two steps, the same messages
applied the same way by the AsyncEngine's thread (queued from the event loop) and by an
engine core process (pulled from its pipe).

A request the engine will not add is refused, sorted by whose fault it is: a ValueError
(InvalidParam naming the field) is the client's to fix (a 400); any other exception is
that request's own failure (a 500). Neither touches another request.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.engine.client import RequestFailedError

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


class Add(msgspec.Struct, tag=True):
    request_id: str
    prompt: str | list[int]       # token ids; a string is encoded by the engine's tokenizer
    params: SamplingParams


class Abort(msgspec.Struct, tag=True):
    request_ids: list[str]


class Refused(msgspec.Struct, array_like=True):
    """A request the engine would not add: `client_error` for a refusal (`param` the
    field when one is named), else a failure of the request's own processing."""

    request_id: str
    message: str
    param: str | None
    client_error: bool

    def error(self) -> Exception:
        """What the request's stream raises."""
        if not self.client_error:
            return RequestFailedError(f"request {self.request_id} failed: {self.message}")
        return InvalidParam(self.param, self.message) if self.param \
            else ValueError(self.message)


def take(engine: Engine, message: Add | Abort) -> Refused | None:
    """Apply one message to the engine (between two steps); the refusal, if the engine
    would not add the request (then nothing changed)."""
    if isinstance(message, Abort):
        for request_id in message.request_ids:
            engine.abort(request_id)
        return None
    try:
        engine.add_request(message.prompt, message.params, message.request_id)
    except ValueError as exc:                   # refused: the client's to fix
        return Refused(message.request_id, str(exc), getattr(exc, "param", None), True)
    except Exception as exc:  # noqa: BLE001 - this request's failure alone
        return Refused(message.request_id, f"{type(exc).__name__}: {exc}", None, False)
    return None
