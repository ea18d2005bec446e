"""The messages between the API server and the engine core (msgpack, by msgspec).

Server -> core, on one PUSH/PULL pipe:  Add, Abort, Shutdown.
Core -> server, on another:             Ready once, then one Step per engine step (the
deltas of every request it advanced, the requests it refused, the metrics snapshot),
or Dead when the shared step failed (the core exits after sending it).

A delta carries token ids only: text, stop strings and detokenization are the server's.
"""
from __future__ import annotations

import msgspec

from runtime.core.sampling_params import SamplingParams


class Add(msgspec.Struct, tag=True):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


class Abort(msgspec.Struct, tag=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    summary: dict
    snapshot: dict


class Delta(msgspec.Struct, array_like=True):
    """What one step produced for one request: `logprobs` holds, per new token,
    (token, logprob, [(top token, logprob), ...])."""

    request_id: str
    new_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []
    error: str | None = None
    num_cached_tokens: int | None = None


class Refused(msgspec.Struct, array_like=True):
    """A request the core would not add: `param` is set for a client error (a 400),
    None for a failure of the request's own processing (a 500)."""

    request_id: str
    message: str
    param: str | None
    client_error: bool


class Step(msgspec.Struct, tag=True):
    deltas: list[Delta]
    refused: list[Refused]
    snapshot: dict


class Dead(msgspec.Struct, tag=True):
    error: str


ToCore = Add | Abort | Shutdown
FromCore = Ready | Step | Dead
