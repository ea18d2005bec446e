"""The scheduler's queue of waiting requests: who is admitted next. Torch-free, I/O-free.

    front    requests preempted (recompute): admitted before anything else, the last
             one preempted first
    groups   the other waiting requests by `Request.group` (the HTTP body they came
             from; a request without one is a group of its own), each group in arrival
             order; the groups take turns: the head of the queue is the first request of
             the group whose turn it is, and a group that had a request admitted goes
             to the back of the turns

So one body of many requests delays another group's first admission by at most one
admission per group ahead of it in the turns, whatever its size; requests without a
group (one per body) keep their arrival order among themselves. When no running slot is
free, the scheduler takes the first request of a group with nothing running out of its
turn (`take_idle`) and puts it at the very front, after preempting a row of the largest
group for it.

Removal is lazy: `discard` forgets a request in O(1) and the queues drop it when they
reach it (or when they are compacted, once most of what they hold is gone), so aborting
N waiting requests costs O(N), not O(N^2).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator

from runtime.core.request import Request


class WaitingQueue:
    """The waiting requests in admission order (see the module docstring)."""

    def __init__(self):
        self._live: set[Request] = set()              # the requests waiting now
        self._front: deque[Request] = deque()         # preempted, next first
        self._groups: dict[Hashable, deque[Request]] = {}
        self._turns: deque[Hashable] = deque()        # the keys of `_groups`, in turn
        self._held = 0            # entries in the deques, those discarded included

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request: Request) -> bool:
        return request in self._live

    def append(self, request: Request) -> None:
        """Queue a new request at the back of its group."""
        key = group_key(request)
        queue = self._groups.get(key)
        if queue is None:
            queue = self._groups[key] = deque()
            self._turns.append(key)
        queue.append(request)
        self._add(request)

    def appendleft(self, request: Request) -> None:
        """Queue a preempted request ahead of every other."""
        self._front.appendleft(request)
        self._add(request)

    def _add(self, request: Request) -> None:
        if request in self._live:
            raise ValueError(f"request {request.request_id!r} is already waiting")
        self._live.add(request)
        self._held += 1

    def discard(self, request: Request) -> bool:
        """Forget a waiting request (it ended); False if it was not waiting."""
        if request not in self._live:
            return False
        self._live.remove(request)
        if self._held > 2 * len(self._live) + 64:
            self._compact()
        return True

    def peek(self) -> Request | None:
        """The request admitted next, or None."""
        self._settle()
        if self._front:
            return self._front[0]
        return self._groups[self._turns[0]][0] if self._turns else None

    def popleft(self) -> Request:
        """Take the request admitted next; its group goes to the back of the turns."""
        self._settle()
        if self._front:
            request = self._front.popleft()
        elif self._turns:
            key = self._turns.popleft()
            queue = self._groups[key]
            request = queue.popleft()
            if queue:
                self._turns.append(key)
            else:
                del self._groups[key]
        else:
            raise IndexError("no request is waiting")
        self._held -= 1
        self._live.remove(request)
        return request

    def take_idle(self, idle: Callable[[Hashable], bool]) -> Request | None:
        """Take the first request, in turn order, of a group `idle(group_key)` holds
        idle (the preempted at the front are not looked at); None if there is none.
        O(groups)."""
        for key in list(self._turns):
            queue = self._groups[key]
            self._held -= _drop_head(queue, self._live)
            if not queue:
                del self._groups[key]
                self._turns.remove(key)
            elif idle(key):
                request = queue.popleft()
                if not queue:
                    del self._groups[key]
                    self._turns.remove(key)
                self._held -= 1
                self._live.remove(request)
                return request
        return None

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in the order they would be admitted (O(n): for metrics
        and tests, not the step)."""
        yield from (r for r in self._front if r in self._live)
        queues = [[r for r in self._groups[key] if r in self._live] for key in self._turns]
        for turn in range(max(map(len, queues), default=0)):
            yield from (queue[turn] for queue in queues if turn < len(queue))

    def _settle(self) -> None:
        """Drop discarded requests from the heads: the front's, and the groups' whose
        turn comes first (a group left empty leaves the turns)."""
        self._held -= _drop_head(self._front, self._live)
        while self._turns:
            key = self._turns[0]
            queue = self._groups[key]
            self._held -= _drop_head(queue, self._live)
            if queue:
                return
            del self._groups[key]
            self._turns.popleft()

    def _compact(self) -> None:
        """Drop every discarded request (O(held), once per as many discards)."""
        self._front = deque(r for r in self._front if r in self._live)
        for key in list(self._turns):
            kept = deque(r for r in self._groups[key] if r in self._live)
            if kept:
                self._groups[key] = kept
            else:
                del self._groups[key]
        self._turns = deque(key for key in self._turns if key in self._groups)
        self._held = len(self._live)


def group_key(request: Request) -> Hashable:
    """A request's group: its body's, or the request itself."""
    return request if request.group is None else ("group", request.group)


def _drop_head(queue: deque[Request], live: set[Request]) -> int:
    dropped = 0
    while queue and queue[0] not in live:
        queue.popleft()
        dropped += 1
    return dropped
