"""The executor: what runs a step's launches on the replica's ranks, as the engine sees it.

    ModelRunner  runtime/device/model_runner.py   every rank in this process (uni)
    Workers      runtime/executor/workers.py      one worker process per rank (mp)

The engine holds one and uses only what this protocol declares; what an executor can do
is declared here too (`compiles`, `graphs`, `rank_processes`), so a new kind of executor is
a new class, never a branch in the engine.
"""
from __future__ import annotations

from collections import Counter
from concurrent.futures import Future
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from runtime.backends import get_backend
from runtime.core.config import EngineConfig

if TYPE_CHECKING:
    import torch

    from runtime.backends.compiled.graphs import Graphs
    from runtime.core.request import Request
    from runtime.core.scheduler import SchedulerOutput
    from runtime.device.step_result import StepResult, Timing
    from runtime.text.grammar import StructuredOutputs


def backend_name(config: EngineConfig, spec: ModuleType) -> str:
    """The kernel backend's registered name: the flag's, else the spec's; under
    --enforce-eager its eager variant (the compiled backend's graphs run as they are)."""
    name = config.backend or spec.contract.BACKEND
    eager = get_backend(name).eager_variant if config.enforce_eager else None
    return eager or name


class Executor(Protocol):
    device: torch.device | str  # where the ranks run, for the startup log ("per rank": mp)
    dispatches: Counter[str]    # launches so far, by kernel name (rank 0's with mp)
    timing: Timing              # seconds so far by phase (rank 0's with mp)

    def execute(self, out: SchedulerOutput) -> dict[Request, StepResult]:
        """Run one step; each scheduled request's result."""

    def forget(self, request_id: str) -> None:
        """A request ended: drop what is kept for it (its stream, its matcher)."""

    def prepare(self, constraint: StructuredOutputs) -> Future:
        """Start compiling a request's grammar off the step; the result goes to adopt."""

    def adopt(self, request: Request, prepared) -> None:
        """The compiled grammar (prepare's result) becomes the request's."""

    def compiles(self) -> bool:
        """Whether warmup() has graphs to compile (or load) here."""

    def warmup(self) -> None:
        """Run every kernel once, so that each graph is compiled (or loaded) now."""

    def graphs(self) -> Graphs | None:
        """The compiling graphs of this process (None: none compile here)."""

    def pending_graphs(self) -> int:
        """Graphs run eagerly until a compile saves them (defer_compile): this
        process's, or the most any rank process has."""

    def rank_processes(self) -> list[dict]:
        """Per process that holds ranks, for /server_info: rank, pid, host, device,
        param_bytes, pool_bytes of each rank worker (mp); ranks and pid (uni)."""

    def param_bytes_per_rank(self) -> int:
        """The weight bytes the fullest rank holds."""

    def resident(self) -> dict[str, int]:
        """Device bytes this process holds: resident_weight_bytes, resident_pool_bytes
        (zero with mp: the rank processes hold theirs)."""

    def close(self) -> None:
        """Stop: the rank workers (mp), the grammar thread."""
