"""Waiting queues for the two scheduling policies."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from paged_core.sched.request import Request


class FcfsQueue:
    """Arrival order; a preempted request goes back in front of every waiting request it outranks.

    That is the very front, except when a fork's child was preempted earlier: a child ranks with its parent's
    arrival, so it can rank after a request that was waiting when the child entered the running set. Putting
    every victim at the very front let such a later-ranked victim overtake, and starve, an earlier one.
    """

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        key = req.order_key()
        for i, other in enumerate(self._q):
            if key < other.order_key():
                self._q.insert(i, req)
                return
        self._q.append(req)

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
