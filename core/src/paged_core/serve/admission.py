"""Admission: a bound on the engine sequences in flight, so overload is answered with 429 instead of queued forever.

The bound is ``max_num_seqs + max_queued_requests`` sequences counted on the
event loop, from the moment a generation request is admitted (before its body
is read or tokenized) until its :class:`~paged_core.serve.generation.Generation`
closes. Why this count and not the scheduler's ``num_waiting``: the engine
thread's snapshot lags behind (requests being tokenized or sitting in the
command queue are in neither of its queues), so a flood arriving within one
step would all pass a check against it. The event-loop count is exact and is
decided before any work. Since at most ``max_num_seqs`` sequences run at once,
whatever is admitted beyond them waits, so the waiting queue never holds more
than ``max_queued_requests`` while the engine runs a full batch (when KV blocks
rather than ``max_num_seqs`` limit the batch, up to ``max_num_seqs`` more wait).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse

from paged_core.serve.errors import APIError

# Seconds a refused client is told to wait: about the time a few decode steps free a slot.
RETRY_AFTER_S = 1


class QueueFull(APIError):
    """A 429 (OpenAI's ``rate_limit_error``) that carries ``Retry-After``."""

    def __init__(self, message: str, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(429, message, code="queue_full")
        self.retry_after = retry_after

    def response(self, path: str = "") -> JSONResponse:
        """The error JSON with ``Retry-After`` (seconds)."""
        response = super().response(path)
        response.headers["Retry-After"] = str(self.retry_after)
        return response


class Ticket:
    """The slots one HTTP request holds; released once, by whoever owns it last."""

    def __init__(self, gate: Admission, size: int) -> None:
        self.gate = gate
        self.size = size
        self.adopted = False
        self.released = False

    def adopt(self, size: int) -> None:
        """Take the ticket over (a ``Generation``) and resize it to ``size`` sequences; raises :class:`QueueFull`."""
        self.gate.resize(self, size)
        self.adopted = True

    def release(self) -> None:
        """Give the slots back (idempotent)."""
        if not self.released:
            self.released = True
            self.gate.release(self)


class Admission:
    """Counts engine sequences in flight against ``running_limit + queue_limit``.

    ``on_change(in_flight)`` and ``on_refuse(reason)`` feed the metrics. A
    request larger than the whole bound counts as the whole bound, so it gets
    in when the server is otherwise idle instead of being refused for ever.
    """

    def __init__(
        self,
        running_limit: int,
        queue_limit: int,
        on_change: Callable[[int], None] | None = None,
        on_refuse: Callable[[str], None] | None = None,
    ) -> None:
        self.running_limit = running_limit
        self.queue_limit = queue_limit
        self.capacity = running_limit + queue_limit
        self.in_flight = 0
        self.on_change = on_change
        self.on_refuse = on_refuse

    def acquire(self, size: int = 1) -> Ticket:
        """A ticket for ``size`` sequences, or :class:`QueueFull` if they would exceed the bound."""
        size = self._weight(size)
        self._check(size)
        self._set(self.in_flight + size)
        return Ticket(self, size)

    def resize(self, ticket: Ticket, size: int) -> None:
        """Grow or shrink ``ticket`` to ``size`` sequences; on :class:`QueueFull` it keeps its old size."""
        if ticket.released:
            raise RuntimeError("cannot resize a released admission ticket")
        size = self._weight(size)
        if size > ticket.size:
            self._check(size - ticket.size)
        self._set(self.in_flight + size - ticket.size)
        ticket.size = size

    def release(self, ticket: Ticket) -> None:
        """Return ``ticket``'s slots (call through :meth:`Ticket.release`)."""
        self._set(self.in_flight - ticket.size)

    def _weight(self, size: int) -> int:
        return max(1, min(size, self.capacity))

    def _check(self, extra: int) -> None:
        if self.in_flight + extra > self.capacity:
            if self.on_refuse is not None:
                self.on_refuse("queue_full")
            raise QueueFull(
                f"server is at capacity: {self.in_flight} sequences in flight, the limit is {self.capacity} "
                f"(max_num_seqs {self.running_limit} + max_queued_requests {self.queue_limit}); retry later"
            )

    def _set(self, value: int) -> None:
        self.in_flight = value
        if self.on_change is not None:
            self.on_change(value)


async def admit(request: Request) -> AsyncIterator[None]:
    """Route dependency: hold a slot for the request, or refuse it (429) before its body is even read.

    The ticket is left in ``request.state.admission`` for the route's
    :class:`Generation` to adopt (it then releases it when its requests end,
    which for a stream is after this dependency has exited); a request that
    fails before reaching the engine gives its slot back here.
    """
    gate: Admission = request.app.state.paged.admission
    ticket = gate.acquire()
    request.state.admission = ticket
    try:
        yield
    finally:
        if not ticket.adopted:
            ticket.release()
