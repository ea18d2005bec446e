"""One request: the only object passed between scheduler, runner and engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from runtime.core.sampling_params import SamplingParams
from runtime.core.speculation import Acceptance


class Status(enum.Enum):
    WAITING = "waiting"      # queued, or preempted and queued again (holds nothing)
    RUNNING = "running"      # owns a rank, blocks and (with MTP) a state slot
    FINISHED = "finished"


@dataclass(eq=False)   # identity: one object per request, usable as a key
class Request:
    """A generation request.

    Fields below `status` are owned by the scheduler: they change only through it.
    token_ids = prompt + output; the KV of token_ids[:num_computed] is in the pools;
    during decode token_ids[-1] (the tail) is the next input and is not yet computed.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int                              # admission order; larger = later
    eos_token_id: int | None = None
    # the HTTP body it came from (its prompts x n): admission takes turns between groups
    # (runtime/core/waiting_queue.py); None: a group of its own
    group: str | None = None
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    rank: int | None = None
    blocks: dict[str, list[int]] = field(default_factory=dict)   # group -> block ids
    reach: int = 0                            # positions `blocks` hold (known lower bound)
    slot: int | None = None                   # MTP device-state slot on `rank`
    slot_generation: int = 0
    num_computed: int = 0
    finish_reason: str | None = None          # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int | None = None      # prompt tokens the first admission found cached
    cached_blocks: int = 0                    # leading blocks in the prefix cache (hit or saved)
    block_keys: list[bytes] = field(default_factory=list)   # prefix-cache keys, computed once
    draft_tokens: int = 0                     # MTP statistics
    accepted_tokens: int = 0
    acceptance: Acceptance = field(default_factory=Acceptance)   # per draft position

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output as one new list: O(context). The step path reads `tail` and
        `tokens(start, end)` instead, which cost O(1) and O(end - start)."""
        return self.prompt_ids + self.output_ids

    @property
    def tail(self) -> int:
        """The last known token (the next input of a decode)."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def tokens(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] (0 <= start <= end), without building token_ids."""
        cut = len(self.prompt_ids)
        if end <= cut:
            return self.prompt_ids[start:end]
        if start >= cut:
            return self.output_ids[start - cut:end - cut]
        return self.prompt_ids[start:] + self.output_ids[:end - cut]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        """True until every known token but the tail has its KV in the pools."""
        return self.num_computed < self.num_tokens - (1 if self.output_ids else 0)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
