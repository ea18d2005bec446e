"""Everything the engine and its rank workers send each other (msgpack, by msgspec): typed
messages that decode into plain data, never into code, whoever wrote the bytes.

Engine -> rank 0 (ZMQ PAIR), and rank 0 -> every rank (a uint8 tensor broadcast):

    Plan       one step, as a diff against what the ranks already hold (step_plan.py)
    Heartbeat  rank 0's own, while the engine has no step to send
    Shutdown   the engine closes

Rank 0 -> engine:

    Ready      once, every rank's RankInfo, after the ranks warmed up
    Reply      per Plan, every rank's Results (gathered as msgpack bytes over the group)
    Dead       a rank failed; rank 0 exits after sending it

A request is named by its handle: a small integer the engine's PlanWriter gives it when
the ranks first see it (its Intro) and takes back when the engine forgets it, so that a
row costs a few bytes, not its id. Every struct travels as an array (no field names).
"""
from __future__ import annotations

import msgspec

from runtime.core.sampling_params import SamplingParams
from runtime.device.step_result import StepResult, TokenLogprobs

# -- a step, to the ranks ---------------------------------------------------------------


class Intro(msgspec.Struct, array_like=True):
    """A request the ranks have not seen: what never changes about it, sent once."""

    handle: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None
    arrival: int


class Placement(msgspec.Struct, array_like=True):
    """Where a request runs after a (re)admission, a preemption or its end: its rank,
    MTP slot and generation, and its block lists whole (group -> block ids)."""

    rank: int | None
    slot: int | None
    slot_generation: int
    blocks: dict[str, list[int]]


class Sync(msgspec.Struct, array_like=True, omit_defaults=True):
    """What changed about a request the step refers to since the ranks last saw it:
    output tokens appended, block ids appended per group, or a new Placement (then
    `grown` is empty: the lists come whole). Trailing defaults are not sent, so a
    steady decode row is [handle, [token, ...]]."""

    handle: int
    tokens: list[int] = []
    grown: dict[str, list[int]] = {}
    placed: Placement | None = None


class Chunk(msgspec.Struct, array_like=True):
    """A prefill chunk (runtime/core/scheduler.py PrefillChunk) of request `handle`."""

    handle: int
    slot: int
    start: int
    length: int


class Pages(msgspec.Struct, array_like=True):
    """Pages handed to new owners on one (rank, group): SchedulerOutput.fresh_blocks."""

    rank: int
    group: str
    ids: list[int]


class Copy(msgspec.Struct, array_like=True):
    """A page copy (runtime/core/cache_manager.py PageCopy)."""

    rank: int
    group: str
    src: int
    dst: int


class SaveCopies(msgspec.Struct, array_like=True):
    """A prefix-cache save (runtime/core/cache_manager.py Save) of request `handle`."""

    handle: int
    rank: int
    boundary: int
    copies: list[Copy]
    pages: dict[str, int]


class Plan(msgspec.Struct, array_like=True, tag=True):
    """One engine step for every rank. The ranks apply `intros`, then `syncs`, then read
    the step's rows by handle; the handles of `forget` are dropped after the step (a
    request that ended may still have a save in it)."""

    intros: list[Intro]
    syncs: list[Sync]
    decode: list[list[int]]                 # handles, per decode launch
    prefill: list[Chunk]
    fresh_blocks: list[Pages]
    fresh_slots: list[int]                  # handles: new slot owners
    saves: list[SaveCopies]
    restores: list[Copy]
    snapshots: list[SaveCopies]
    extents: list[int]                      # the main prefill launches' over every rank
    forget: list[int]                       # handles of requests the engine forgot
    k: int | None = None                    # the decode launches' drafts (None: the K)
    keep_slots: bool = True                 # at K=0: the kernel that keeps the MTP slots


class Heartbeat(msgspec.Struct, array_like=True, tag=True):
    pass


class Shutdown(msgspec.Struct, array_like=True, tag=True):
    pass


ToRanks = Plan | Heartbeat | Shutdown

# -- results, from the ranks ------------------------------------------------------------


class Failure(msgspec.Struct, array_like=True):
    """A request's own failure on a rank: the exception's type name and text."""

    kind: str
    message: str


class Result(msgspec.Struct, array_like=True, omit_defaults=True):
    """A StepResult (runtime/device/step_result.py) of request `handle`."""

    handle: int
    tokens: list[int]
    logprobs: list[TokenLogprobs] | None = None
    drafted: int = 0
    accepted: int = 0
    error: Failure | None = None


class RankInfo(msgspec.Struct):
    """A rank's process, for /server_info and the startup log."""

    rank: int
    pid: int
    host: str
    device: str
    param_bytes: int
    pool_bytes: int
    pending_graphs: int = 0         # graphs it runs eagerly until their artifacts appear


class Ready(msgspec.Struct, array_like=True, tag=True):
    ranks: list[RankInfo]


class Reply(msgspec.Struct, array_like=True, tag=True):
    """What the ranks made of a Plan: every rank's results, and rank 0's time and
    dispatch counts so far."""

    results: list[Result]
    timing: tuple[float, float, float]      # marshal, kernel, sample seconds
    dispatches: dict[str, int]


class Dead(msgspec.Struct, array_like=True, tag=True):
    error: str


FromRanks = Ready | Reply | Dead

# -- StepResult <-> Result ----------------------------------------------------------------


class RankError(RuntimeError):
    """A request's failure on a rank, rebuilt in the engine under the original's type
    name (a subclass per name), so that `f"{type(e).__name__}: {e}"` reads as it would
    have in the rank's process."""


_REBUILT: dict[str, type[RankError]] = {}


def result_message(handle: int, result: StepResult) -> Result:
    error = result.error
    failure = None if error is None else Failure(type(error).__name__, str(error))
    return Result(handle, result.tokens, result.logprobs, result.drafted, result.accepted,
                  failure)


def step_result(message: Result) -> StepResult:
    failure = message.error
    error = None if failure is None else rebuilt(failure)
    return StepResult(message.tokens, message.logprobs, message.drafted, message.accepted,
                      error)


def rebuilt(failure: Failure) -> RankError:
    kind = _REBUILT.get(failure.kind)
    if kind is None:
        kind = _REBUILT[failure.kind] = type(failure.kind, (RankError,), {})
    return kind(failure.message)
