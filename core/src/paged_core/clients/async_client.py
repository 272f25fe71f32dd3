"""The server's two ways to reach an engine core: a thread in this process, or a child process.

Both deliver every :class:`CoreOutputs` to ``on_outputs`` on the event loop, report the core's death
to ``on_dead`` (with the cause) on the event loop, and answer :meth:`add` with the core's admission.
The event loop never blocks on the core: the thread client queues commands for its engine thread;
the process client sends on its PUSH socket and a reader thread receives.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from paged_core.clients.core_process import CoreProcess
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreAdmission,
    CoreFacts,
    CoreOutputs,
    CoreRequest,
    CoreUtility,
    CoreUtilityResult,
    SchedulerStats,
)
from paged_core.errors import EngineDeadError, PagedError, RequestRejectedError

log = logging.getLogger("paged.serve")

OnOutputs = Callable[[CoreOutputs], None]
OnDead = Callable[[str], None]
OnFailed = Callable[[list[str], BaseException], None]
"""``on_failed(request_ids, error)``: end these requests' streams with ``error`` (one of several cores died)."""


class AsyncCoreClient(Protocol):
    """What :class:`~paged_core.serve.async_engine.AsyncEngine` needs from a core."""

    facts: CoreFacts
    stats: SchedulerStats

    def start(self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead,
              on_failed: OnFailed | None = None) -> None:  # fmt: skip
        """Begin delivering outputs (call on the event loop).

        ``on_failed`` is for clients over several cores (data parallel), where one core's death ends only its
        own requests; a single-core client never calls it (its death is ``on_dead``).
        """

    async def add(self, request: CoreRequest) -> None:
        """Queue a request; raises :class:`RequestRejectedError` (refused) or :class:`EngineDeadError`."""

    def abort(self, abort: CoreAbort) -> None:
        """End requests or sequences (never blocks)."""

    async def call(self, method: str) -> Any:
        """A utility call (``reset_prefix_cache``, ``stats``)."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the core; afterwards nothing is delivered."""


def _settle(future: asyncio.Future[Any], error: BaseException | None, result: Any = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


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


class ThreadCoreClient:
    """An in-process :class:`.EngineCore` stepped on its own thread (``--engine-in-process``).

    The core is not thread-safe, so exactly one thread touches it; after each step the thread hands
    the outputs to the event loop in one ``call_soon_threadsafe`` and starts the next step at once.
    """

    def __init__(self, core: Any) -> None:
        self.core = core
        self.facts: CoreFacts = core.facts()
        self.stats: SchedulerStats = core.stats()
        self._cmds: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._deliver = _Deliver()
        self._thread: threading.Thread | None = None
        self._on_outputs: OnOutputs | None = None
        self._on_dead: OnDead | None = None
        self._dead: str | None = None

    def start(self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead,
              on_failed: OnFailed | None = None) -> None:  # fmt: skip
        if self._thread is not None:
            raise RuntimeError("core client already started")
        self._deliver.loop = loop
        self._on_outputs, self._on_dead = on_outputs, on_dead
        self._thread = threading.Thread(target=self._run, name="paged-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    async def add(self, request: CoreRequest) -> None:
        if not self.alive:
            raise EngineDeadError(f"engine is not running ({self._dead or 'stopped'})")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._cmds.put(("add", request, future))
        await future

    def abort(self, abort: CoreAbort) -> None:
        self._cmds.put(("abort", abort))

    async def call(self, method: str) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._cmds.put(("call", method, future))
        return await future

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._cmds.put(("stop",))
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.core.close()

    # ---- engine thread --------------------------------------------------
    def _run(self) -> None:
        core = self.core
        try:
            while True:
                changed = self._drain(block=not core.has_unfinished_requests())
                if changed is None:
                    return
                if core.has_unfinished_requests():
                    outputs = core.step()
                elif changed:
                    outputs = CoreOutputs([], core.stats())
                else:
                    continue
                self.stats = outputs.stats
                assert self._on_outputs is not None
                self._deliver(self._on_outputs, outputs)
        except BaseException as exc:  # the loop itself broke: report it and refuse new work
            log.exception("engine thread died")
            self._dead = f"engine thread died: {exc!r}"
            assert self._on_dead is not None
            self._deliver(self._on_dead, self._dead)
        finally:
            self._refuse_queued()

    def _drain(self, block: bool) -> bool | None:
        """Apply queued commands (waiting for one if idle); None once asked to stop, else whether any changed state."""
        changed = False
        while True:
            try:
                cmd = self._cmds.get(timeout=1.0) if block else self._cmds.get_nowait()
            except queue.Empty:
                if block:
                    continue
                return changed
            block = False
            kind = cmd[0]
            if kind == "stop":
                return None
            if kind == "abort":
                self.core.abort(cmd[1])
                changed = True
            elif kind == "add":
                error: BaseException | None = None
                try:
                    self.core.add_request(cmd[1])
                    changed = True
                except PagedError as exc:
                    error = exc
                self._deliver(_settle, cmd[2], error)
            elif kind == "call":
                try:
                    self._deliver(_settle, cmd[2], None, self.core.call(cmd[1]))
                except Exception as exc:
                    self._deliver(_settle, cmd[2], exc)

    def _refuse_queued(self) -> None:
        """Settle the futures of commands that arrived after the loop ended, so no caller waits forever."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] in ("add", "call"):
                self._deliver(_settle, cmd[-1], EngineDeadError("engine is not running"))


class AsyncMPClient:
    """An engine core in a child process (:class:`CoreProcess`), the default of ``paged serve``.

    A reader thread receives from the core and hands each message to the event loop; it also
    watches the process, so the core's death reaches ``on_dead`` within :data:`POLL_MS`.
    """

    def __init__(self, process: CoreProcess) -> None:
        self.process = process
        self.facts: CoreFacts = process.wait_ready()
        self.stats: SchedulerStats = process.stats
        self._deliver = _Deliver()
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._admissions: dict[str, asyncio.Future[None]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._on_outputs: OnOutputs | None = None
        self._on_dead: OnDead | None = None
        self._dead: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self.process.alive

    def start(self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead,
              on_failed: OnFailed | None = None) -> None:  # fmt: skip
        if self._reader is not None:
            raise RuntimeError("core client already started")
        self._deliver.loop = loop
        self._on_outputs, self._on_dead = on_outputs, on_dead
        self._reader = threading.Thread(target=self._read, name="paged-core-reader", daemon=True)
        self._reader.start()

    async def add(self, request: CoreRequest) -> None:
        if not self.alive:
            raise EngineDeadError(self._dead or "the engine core is not running")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._admissions[request.request_id] = future
        try:
            self.process.send(request)
            await future
        finally:
            self._admissions.pop(request.request_id, None)

    def abort(self, abort: CoreAbort) -> None:
        if self.alive:
            self.process.send(abort)

    async def call(self, method: str) -> Any:
        if not self.alive:
            raise EngineDeadError(self._dead or "the engine core is not running")
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self.process.send(CoreUtility(call_id, method))
            return await future
        finally:
            self._calls.pop(call_id, None)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(2.0)
        self.process.close(timeout)

    # ---- reader thread --------------------------------------------------
    def _read(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self.process.recv(100)
            except EngineDeadError as exc:
                if not self._stopping.is_set():
                    self._dead = str(exc)
                    log.error("%s", exc)
                    self._deliver(self._died, str(exc))
                return
            except Exception as exc:  # an undecodable message from the core: a bug, but never fatal here
                log.error("dropped an unreadable message from the engine core: %s", exc)
                continue
            if isinstance(msg, CoreOutputs):
                self.stats = msg.stats
                assert self._on_outputs is not None
                self._deliver(self._on_outputs, msg)
            elif isinstance(msg, CoreAdmission):
                self._deliver(self._admit, msg)
            elif isinstance(msg, CoreUtilityResult):
                self._deliver(self._answer, msg)

    # ---- on the event loop ----------------------------------------------
    def _admit(self, msg: CoreAdmission) -> None:
        for rid in msg.accepted:
            future = self._admissions.get(rid)
            if future is not None:
                _settle(future, None)
        for rid, why in msg.rejected.items():
            future = self._admissions.get(rid)
            if future is not None:
                _settle(future, RequestRejectedError(why))

    def _answer(self, msg: CoreUtilityResult) -> None:
        future = self._calls.get(msg.call_id)
        if future is not None:
            _settle(future, RuntimeError(msg.error) if msg.error is not None else None, msg.result)

    def _died(self, why: str) -> None:
        for future in [*self._admissions.values(), *self._calls.values()]:
            _settle(future, EngineDeadError(why))
        assert self._on_dead is not None
        self._on_dead(why)
