"""EventLoopClient: the server's client over a :class:`~paged_core.clients.transport.Transport`.

Over a :class:`~paged_core.clients.core_process.CoreProcess` it is ``paged serve``'s default; over a
:class:`~paged_core.clients.core_thread.CoreThread`, ``--engine-in-process``. The event loop never blocks on the
core: adds, aborts and calls are sends, and a reader thread receives, handing each message to the loop (outputs
to ``on_outputs``, answers to the waiting call). The reader also sees the core die, within :data:`POLL_MS`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from paged_core.clients.interface import AsyncCoreClient, OnDead, OnFailed, OnOutputs
from paged_core.clients.transport import Transport
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreOutputs,
    CoreRequest,
    CoreRequests,
    CoreUtility,
    CoreUtilityResult,
)
from paged_core.errors import EngineDeadError

log = logging.getLogger("paged.serve")

POLL_MS = 100
"""How long the reader waits for a message before checking whether it should stop."""


class _Deliver:
    """Hands results from a background thread to the event loop (dropped once the loop is closed)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed between the check and the call (shutdown)
                pass


class EventLoopClient(AsyncCoreClient):
    """One core behind ``transport``, delivering to an asyncio event loop (see the module docstring)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.facts = transport.wait_ready()
        self.stats = transport.stats
        self._deliver = _Deliver()
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._on_outputs: OnOutputs | None = None
        self._on_dead: OnDead | None = None
        self._dead: str | None = None

    @property
    def pid(self) -> int | None:
        return self.transport.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self.transport.alive

    def start(
        self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead, on_failed: OnFailed | None = None
    ) -> None:
        if self._reader is not None:
            raise RuntimeError("core client already started")
        self._deliver.loop = loop
        self._on_outputs, self._on_dead = on_outputs, on_dead
        self._reader = threading.Thread(target=self._read, name="paged-core-reader", daemon=True)
        self._reader.start()

    def _require_alive(self) -> None:
        if not self.alive:
            raise EngineDeadError(f"engine is not running ({self._dead or 'stopped'})")

    def add(self, requests: Sequence[CoreRequest]) -> dict[str, str]:
        self._require_alive()
        if len(requests) == 1:
            self.transport.send(requests[0])
        elif requests:
            self.transport.send(CoreRequests(list(requests)))
        return {}

    def abort(self, abort: CoreAbort) -> None:
        if self.alive:
            self.transport.send(abort)

    async def call(self, method: str, *args: Any) -> Any:
        self._require_alive()
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self.transport.send(CoreUtility(call_id, method, args))
            return await future
        finally:
            self._calls.pop(call_id, None)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(2.0)
        self.transport.close(timeout)

    # ---- reader thread --------------------------------------------------
    def _read(self) -> None:
        while not self._stopping.is_set():
            try:
                message = self.transport.recv(POLL_MS)
            except EngineDeadError as exc:
                if not self._stopping.is_set():
                    self._dead = str(exc)
                    log.error("%s", exc)
                    self._deliver(self._died, str(exc))
                return
            except Exception as exc:  # an undecodable message from the core: a bug, but never fatal here
                log.error("dropped an unreadable message from the engine core: %s", exc)
                continue
            if isinstance(message, CoreOutputs):
                self.stats = message.stats
                assert self._on_outputs is not None
                self._deliver(self._on_outputs, message)
            elif isinstance(message, CoreUtilityResult):
                self._deliver(self._answer, message)

    # ---- on the event loop ----------------------------------------------
    def _answer(self, message: CoreUtilityResult) -> None:
        future = self._calls.get(message.call_id)
        if future is not None and not future.done():
            if message.error is not None:
                future.set_exception(RuntimeError(message.error))
            else:
                future.set_result(message.result)

    def _died(self, why: str) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(why))
        assert self._on_dead is not None
        self._on_dead(why)
