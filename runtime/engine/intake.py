"""Intake: the requests and aborts an engine takes between two steps, the same messages
applied the same way by the AsyncEngine's thread (queued from the event loop) and by an
engine core process (pulled from its pipe).

A body (one HTTP request: its prompts x n choices) arrives as one Add: each distinct
prompt once, its sampling params once, and a Choice per engine request naming its
prompt by index (and its seed, where choices differ only by it), so a body of 16k
requests over one prompt carries (and the core decodes) the prompt and params once; a
choice's own params are made when it is added. The Intake
keeps a body's choices until the engine takes them, and between two steps adds at most
`budget` requests, checking at most about `token_budget` prompt tokens (each prompt is
checked once, Admission.check_prompt, when its first choice is added): however large
the bodies, the work a step waits for is bounded, and the bodies pending take turns, so
a small body's requests are added within a step of arriving whatever came before it.
The engine's own admission then takes turns between bodies too (Engine.add_request's
`group`).

An abort of a request still pending drops it (O(1)); of one added, ends it in the
engine. A request the engine will not add is refused, sorted by whose fault it is: a
ValueError (InvalidParam naming the field) is the client's to fix (a 400); any other
exception is that request's own failure (a 500). Neither touches another request.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec

from runtime.core.sampling_params import InvalidParam, SamplingParams
from runtime.engine.client import RequestFailedError

if TYPE_CHECKING:
    from runtime.engine.engine import Engine


class Choice(msgspec.Struct, array_like=True):
    """One engine request of a body."""

    request_id: str
    prompt: int                   # the index of its prompt in the body's `prompts`
    seed: int | None = None       # its own seed (None: the body's params' seed)


class Add(msgspec.Struct, tag=True):
    """One body's requests. `group` (the body's id) is what the engine's admission takes
    turns between (None: each request a group of its own)."""

    prompts: list[str | list[int]]   # token ids; a string is encoded by the engine's tokenizer
    params: SamplingParams           # every choice's, but for its seed
    choices: list[Choice]
    group: str | None = None

    def params_of(self, choice: Choice) -> SamplingParams:
        """The choice's sampling params (a copy with its seed, where it has its own)."""
        if choice.seed is None or choice.seed == self.params.seed:
            return self.params
        return replace(self.params, seed=choice.seed)


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


def refusal(request_id: str, exc: Exception) -> Refused:
    """The Refused of a request whose add raised `exc`."""
    if isinstance(exc, ValueError):             # refused: the client's to fix
        return Refused(request_id, str(exc), getattr(exc, "param", None), True)
    return Refused(request_id, f"{type(exc).__name__}: {exc}", None, False)


class _Body:
    """An Add whose choices are not all added yet: the next to add is choices[at]."""

    def __init__(self, add: Add):
        self.add, self.at = add, 0
        # per prompt: its ids once checked, or why it was refused; None: not checked yet
        self.checked: list[list[int] | Exception | None] = [None] * len(add.prompts)

    @property
    def done(self) -> bool:
        return self.at == len(self.add.choices)


class Intake:
    """The messages an engine was sent and has not taken (see the module docstring).
    Used by one thread: the one that steps the engine."""

    def __init__(self, engine: Engine, budget: int, token_budget: int):
        self.engine, self.budget, self.token_budget = engine, budget, token_budget
        self._bodies: deque[_Body] = deque()    # in turn: the next to add from first
        self._pending: set[str] = set()         # request ids not added yet

    @property
    def pending(self) -> int:
        """Requests sent and not yet added (nor aborted)."""
        return len(self._pending)

    def put(self, message: Add | Abort) -> None:
        """Take a message: a body waits for `admit`; an abort applies at once."""
        if isinstance(message, Abort):
            for request_id in message.request_ids:
                if request_id in self._pending:
                    self._pending.discard(request_id)     # dropped when its turn comes
                else:
                    self.engine.abort(request_id)
            return
        if message.choices:
            self._pending.update(choice.request_id for choice in message.choices)
            self._bodies.append(_Body(message))

    def admit(self) -> list[Refused]:
        """Add the next requests to the engine (one step's share, the bodies taking
        turns); the refusals."""
        refused: list[Refused] = []
        added = checked = 0
        while self._bodies and added < self.budget and checked < self.token_budget:
            body = self._bodies.popleft()
            share = max(1, (self.budget - added) // (len(self._bodies) + 1))
            while not body.done and share and checked < self.token_budget:
                choice = body.add.choices[body.at]
                body.at += 1
                if choice.request_id not in self._pending:
                    continue                              # aborted while pending
                self._pending.discard(choice.request_id)
                checked += self._prompt_cost(body, choice.prompt)
                failed = self._add(body, choice)
                if failed is not None:
                    refused.append(failed)
                added, share = added + 1, share - 1
            if not body.done:
                self._bodies.append(body)
        return refused

    def _prompt_cost(self, body: _Body, index: int) -> int:
        """Check the body's prompt `index` if not yet (its ids kept, or the refusal);
        the tokens it walked (0 when it was checked before)."""
        if body.checked[index] is not None:
            return 0
        prompt = body.add.prompts[index]
        try:
            ids = self._encode(prompt) if isinstance(prompt, str) else prompt
            self.engine.admission.check_prompt(ids)
            body.checked[index] = ids
        except Exception as exc:  # noqa: BLE001 - the prompt's choices are refused
            body.checked[index] = exc
        return len(prompt)

    def _encode(self, prompt: str) -> list[int]:
        if self.engine.tokenizer is None:
            raise InvalidParam("prompt", "this engine has no tokenizer; send token ids")
        return self.engine.tokenizer.encode(prompt)

    def _add(self, body: _Body, choice: Choice) -> Refused | None:
        ids = body.checked[choice.prompt]
        if isinstance(ids, Exception):
            return refusal(choice.request_id, ids)
        try:
            self.engine.add_request(ids, body.add.params_of(choice), choice.request_id,
                                    group=body.add.group)
        except Exception as exc:  # noqa: BLE001 - this request's failure alone
            return refusal(choice.request_id, exc)
        return None
