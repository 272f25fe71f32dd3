"""Waiting queues for the two scheduling policies."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from paged_core.sched.request import Request


class FcfsQueue:
    """Arrival order; a preempted request goes back to the very front."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """Lowest ``priority`` value first, then earliest arrival.

    A preempted request re-enters at its own rank: in front of every request
    it outranks, which is the front of the queue among its peers. Putting a
    low-priority victim ahead of higher-priority waiters would let it take
    back the memory it was just evicted to free.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, float, int], Request]] = []

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority_key(), req))

    prepend = add

    def peek(self) -> Request:
        return self._heap[0][1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[1] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(r for _, r in sorted(self._heap, key=lambda e: e[0]))
