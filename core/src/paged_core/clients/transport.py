"""Transport: the front end's end of its link to one engine core (a child process, or a thread of this process).

:class:`~paged_core.clients.core_process.CoreProcess` (zmq sockets to a core process) and
:class:`~paged_core.clients.core_thread.CoreThread` (queues to a core loop on a thread) both carry the messages of
:mod:`paged_core.engine_core.messages`, so the clients over them (:class:`~paged_core.clients.blocking.BlockingClient`,
:class:`~paged_core.clients.event_loop.EventLoopClient`) cannot tell them apart.
"""

from __future__ import annotations

from typing import Protocol

from paged_core.engine_core.messages import CoreFacts, FromCore, SchedulerStats, ToCore


class Transport(Protocol):
    """Send to one core and receive from it (send from one thread, receive from one thread)."""

    stats: SchedulerStats
    """The core's stats at start-up."""

    def wait_ready(self) -> CoreFacts:
        """Block until the core runs; its facts."""

    def send(self, message: ToCore) -> None:
        """One message to the core; :class:`~paged_core.errors.EngineDeadError` once it is shut down."""

    def recv(self, timeout_ms: int) -> FromCore | None:
        """The next message, or None after ``timeout_ms``; :class:`~paged_core.errors.EngineDeadError` once the core
        has died."""

    @property
    def alive(self) -> bool:
        """True while the core runs."""

    @property
    def pid(self) -> int | None:
        """The core's process id (None for a core thread)."""

    def close(self, timeout: float = 5.0) -> None:
        """Ask the core to stop, wait up to ``timeout``, then make sure it is gone (idempotent)."""
