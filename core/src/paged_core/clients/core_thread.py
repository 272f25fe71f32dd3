"""CoreThread: an engine core stepped by :class:`~paged_core.engine_core.loop.CoreLoop` on a thread of this process.

The in-process :class:`~paged_core.clients.transport.Transport` (``paged serve --engine-in-process``, and the apps
tests build around an in-process core): the same loop a core process runs, over queues carrying the message
objects themselves instead of sockets. The core is not thread-safe, so only the loop's thread touches it.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from paged_core.engine_core.channels import QueueChannel
from paged_core.engine_core.loop import CoreLoop
from paged_core.engine_core.messages import CoreFacts, CoreFailed, CoreShutdown, FromCore, SchedulerStats, ToCore
from paged_core.errors import EngineDeadError

log = logging.getLogger("paged.serve")


class CoreThread:
    """One core and the thread running its loop; started at construction."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.facts: CoreFacts = core.facts()
        self.stats: SchedulerStats = core.stats()
        self.channel = QueueChannel()
        self.loop = CoreLoop(core, self.channel)
        self.dead_cause: str | None = None
        """Why the loop ended on its own (it raised), once it has."""
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="paged-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:  # the loop itself broke: report it, and refuse new work
            log.exception("engine thread died")
            self.dead_cause = f"engine thread died: {exc!r}"

    def wait_ready(self) -> CoreFacts:
        return self.facts

    @property
    def pid(self) -> int | None:
        return None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def send(self, message: ToCore) -> None:
        if self._closed or not self.alive:
            raise EngineDeadError(f"engine is not running ({self.dead_cause or 'stopped'})")
        self.channel.inbox.put(message)

    def recv(self, timeout_ms: int) -> FromCore | None:
        try:
            message = self.channel.outbox.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            if not self.alive:
                raise EngineDeadError(self.dead_cause or "engine is not running") from None
            return None
        if isinstance(message, CoreFailed):  # the loop's last word before it re-raises (a tensor-parallel failure)
            self.dead_cause = message.message
            return None
        return message

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self.channel.inbox.put(CoreShutdown())
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.core.close()
