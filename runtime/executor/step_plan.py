"""What the engine and its rank workers say to each other each step (pickled; see
runtime/executor/workers.py and rank_worker.py), and each rank's share of a step."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.core.cache_manager import PageCopy, Save
from runtime.core.scheduler import PrefillChunk, SchedulerOutput
from runtime.device.step_result import StepResult


@dataclass
class Plan:
    """One engine step for every rank, as the core sends it."""

    out: SchedulerOutput
    extents: list[int]                       # the main prefill launches' over every rank
    forget: list[str] = field(default_factory=list)   # requests ended since the last plan


@dataclass
class Reply:
    """What the ranks made of a plan: every request's result, by request id, and the
    step's time on rank 0."""

    results: dict[str, StepResult]
    timing: tuple[float, float, float]       # marshal, kernel, sample seconds
    dispatches: dict[str, int]


def localize(out: SchedulerOutput, rank: int) -> SchedulerOutput:
    """The share of a step that `rank` runs, its requests' rank made local (0). Every
    decode launch stays, empty or not: each rank takes part in every launch. The requests
    are this process's own copies (unpickled), so renumbering them touches nothing else."""
    mine = {id(r): r for launch in out.decode for r in launch if r.rank == rank}
    mine.update((id(ch.request), ch.request) for ch in out.prefill if ch.request.rank == rank)
    mine.update((id(r), r) for r in out.fresh_slots if r.rank == rank)
    for request in mine.values():
        request.rank = 0
    return SchedulerOutput(
        decode=[[r for r in launch if id(r) in mine] for launch in out.decode],
        prefill=[PrefillChunk(ch.request, ch.slot, ch.start, ch.length)
                 for ch in out.prefill if id(ch.request) in mine],
        fresh_blocks={(0, group): ids for (r, group), ids in out.fresh_blocks.items()
                      if r == rank},
        fresh_slots=[r for r in out.fresh_slots if id(r) in mine],
        saves=_local_saves(out.saves, rank), restores=_local_copies(out.restores, rank),
        snapshots=_local_saves(out.snapshots, rank))


def _local_copies(copies: list[PageCopy], rank: int) -> list[PageCopy]:
    return [PageCopy(0, c.group, c.src, c.dst) for c in copies if c.rank == rank]


def _local_saves(saves: list[Save], rank: int) -> list[Save]:
    """A save's request may have ended (its rank cleared): the save keeps its rank."""
    return [Save(s.request, 0, s.boundary, _local_copies(s.copies, rank), s.pages)
            for s in saves if s.rank == rank]
