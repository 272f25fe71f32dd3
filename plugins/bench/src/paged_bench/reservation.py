"""The reserve-max-length baseline: how KV memory was managed before paging.

Systems like FasterTransformer and Orca give each request one contiguous
region sized for the longest sequence it could reach (``max_len``), because
the output length is unknown at admission. :class:`ReservationAllocator` is
that allocator; :func:`simulate_reserved` runs it with the same step rules
as our scheduler (token budget, running requests first, chunked prompts,
FCFS admission), so the two differ only in how memory is handed out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from paged_bench.trace import UtilizationTrace
from paged_bench.workloads import BenchRequest


class ReservationAllocator:
    """Hands each request ``reserve`` contiguous KV slots out of ``num_slots``, all at admission."""

    def __init__(self, num_slots: int, reserve: int) -> None:
        for name, value in (("num_slots", num_slots), ("reserve", reserve)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if reserve > num_slots:
            raise ValueError(f"reserve ({reserve} slots) exceeds the whole budget ({num_slots} slots)")
        self.num_slots = num_slots
        self.reserve = reserve
        self.holders: set[int] = set()

    @property
    def allocated_slots(self) -> int:
        """Slots reserved by running requests, used or not."""
        return len(self.holders) * self.reserve

    @property
    def max_concurrent(self) -> int:
        """The most requests the budget can ever hold at once."""
        return self.num_slots // self.reserve

    def can_allocate(self) -> bool:
        """Whether one more request's reservation fits."""
        return self.allocated_slots + self.reserve <= self.num_slots

    def allocate(self, request: int) -> None:
        """Reserve ``reserve`` slots for ``request``; raises when it already holds some or none are left."""
        if request in self.holders:
            raise ValueError(f"request {request} already holds a reservation")
        if not self.can_allocate():
            raise ValueError(f"no room for request {request}: {self.allocated_slots} of {self.num_slots} slots held")
        self.holders.add(request)

    def free(self, request: int) -> None:
        """Give back ``request``'s reservation; raises if it holds none."""
        if request not in self.holders:
            raise ValueError(f"request {request} holds no reservation")
        self.holders.discard(request)


def simulate_reserved(
    requests: Sequence[BenchRequest],
    num_slots: int,
    max_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> UtilizationTrace:
    """Run ``requests`` (all arriving at once) under reserve-max-length allocation; one sample per step.

    Each step: running requests take their next prompt chunk or one decode
    token within the token budget, then waiting requests are admitted in
    order while a reservation fits. A sample is taken after scheduling, when
    the step's tokens are about to be written.
    """
    for i, r in enumerate(requests):
        if r.num_tokens > max_len:
            raise ValueError(f"request {i} needs {r.num_tokens} tokens, more than max_len={max_len}")
    alloc = ReservationAllocator(num_slots, max_len)
    trace = UtilizationTrace("reserve-max-length", num_slots)
    waiting = deque(range(len(requests)))
    computed = [0] * len(requests)  # tokens whose KV is written (or written this step)
    running: list[int] = []
    while waiting or running:
        budget = max_num_batched_tokens
        for i in running:
            r = requests[i]
            # Known tokens: the prompt plus every output token sampled so far.
            known = len(r.prompt_token_ids) + max(0, computed[i] - len(r.prompt_token_ids) + 1)
            n = min(known - computed[i], budget)
            computed[i] += n
            budget -= n
        while waiting and budget > 0 and len(running) < max_num_seqs and alloc.can_allocate():
            i = waiting.popleft()
            alloc.allocate(i)
            n = min(len(requests[i].prompt_token_ids), budget)
            computed[i] = n
            budget -= n
            running.append(i)
        if not running:
            raise ValueError(f"no request fits: max_len={max_len} exceeds the budget of {num_slots} slots")
        trace.sample(alloc.allocated_slots, sum(computed[i] for i in running), len(running))
        still = []
        for i in running:
            # Done once the KV of all but the last output token is written (the last is only sampled).
            if computed[i] >= requests[i].num_tokens - 1:
                alloc.free(i)
            else:
                still.append(i)
        running = still
    return trace
