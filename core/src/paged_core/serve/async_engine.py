"""AsyncEngine: the engine stepped on its own thread, fed by a command queue, read through asyncio queues.

The engine is not thread-safe, so exactly one thread touches it. HTTP
handlers send ``add``/``abort`` commands; after each step the thread hands
the outputs to the event loop in one ``call_soon_threadsafe`` and starts the
next step at once, so turning outputs into JSON overlaps the model's work.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from paged_core.engine.outputs import RequestOutput
from paged_core.errors import PagedError
from paged_core.sampling.params import SamplingParams
from paged_core.serve.stats import EngineStats, snapshot

log = logging.getLogger("paged.serve")

StepObserver = Callable[[list[RequestOutput], float], None]
Sink = asyncio.Queue[RequestOutput | BaseException]


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class RequestFailedError(RuntimeError):
    """The engine ended this one request on an error; the other requests go on."""


class RequestStream:
    """The outputs of one request, in step order; iterate with ``async for``.

    Several streams may share one ``sink`` queue (a batched HTTP request);
    the caller then reads the sink and tells requests apart by ``request_id``.
    """

    def __init__(self, request_id: str, sink: Sink | None = None) -> None:
        self.request_id = request_id
        self.queue: Sink = sink if sink is not None else asyncio.Queue()
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item


class AsyncEngine:
    """Runs ``engine.step()`` on a background thread and serves asyncio callers.

    ``observer(outputs, step_end_time)`` is called on the event loop after
    every step that produced outputs (the server's metrics hang there).
    """

    def __init__(self, engine: Any, observer: StepObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self.stats: EngineStats = snapshot(engine, 0)  # safe here: the engine thread has not started yet
        self._cmds: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._steps = 0

    # ---- lifecycle (event loop side) ------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read the outputs."""
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="paged-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current step; pending requests end with :class:`EngineDeadError`."""
        if self._thread is None:
            return
        self._cmds.put(("stop",))
        self._thread.join(timeout)
        self._fail_streams(EngineDeadError("server is shutting down"))

    @property
    def healthy(self) -> bool:
        """True while the engine thread is alive and has not died on an error."""
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def num_streams(self) -> int:
        """Requests the server is still waiting on."""
        return len(self._streams)

    # ---- requests (event loop side) -------------------------------------
    async def add(
        self, request_id: str, prompt: list[int], params: SamplingParams, cache_salt: str | None = None,
        priority: int = 0, sink: Sink | None = None,
    ) -> RequestStream:  # fmt: skip
        """Queue a request; raises the engine's :class:`PagedError` if refused. Outputs go to ``sink`` if given."""
        if not self.healthy:
            raise EngineDeadError(f"engine is not running ({self._dead!r})")
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[None] = loop.create_future()
        if request_id in self._streams:
            raise PagedError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id, sink)
        self._streams[request_id] = stream
        self._cmds.put(("add", request_id, prompt, params, cache_salt, priority, accepted))
        try:
            await accepted
        except BaseException:
            # Refused, or the caller went away while waiting: make sure nothing stays queued.
            self._streams.pop(request_id, None)
            self._cmds.put(("abort", request_id))
            raise
        return stream

    def abort(self, request_id: str) -> bool:
        """Abort a request (its blocks are freed on the engine thread's next turn); False if it was done."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        self._cmds.put(("abort", request_id))
        return True

    # ---- engine thread --------------------------------------------------
    def _run(self) -> None:
        try:
            while self._drain(block=not self.engine.has_unfinished_requests()):
                if self.engine.has_unfinished_requests():
                    self._step()
                self.stats = snapshot(self.engine, self._steps)
        except BaseException as exc:  # the loop itself broke: report it and refuse new work
            log.exception("engine thread died")
            self._dead = exc
            self._call(self._fail_streams, EngineDeadError(f"engine thread died: {exc!r}"))
        finally:
            self._refuse_queued()

    def _refuse_queued(self) -> None:
        """Settle the futures of adds that arrived after the loop ended, so no caller waits forever."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                self._call(_settle, cmd[-1], EngineDeadError("engine is not running"))

    def _drain(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if idle); False once asked to stop."""
        while True:
            try:
                cmd = self._cmds.get(timeout=1.0) if block else self._cmds.get_nowait()
            except queue.Empty:
                if block:
                    self.stats = snapshot(self.engine, self._steps)
                    continue
                return True
            block = False
            if cmd[0] == "stop":
                return False
            if cmd[0] == "abort":
                self.engine.abort_request([cmd[1]])
            elif cmd[0] == "add":
                self._add(*cmd[1:])

    def _add(self, rid: str, prompt: list[int], params: SamplingParams, salt: str | None, priority: int,
             accepted: asyncio.Future[None]) -> None:  # fmt: skip
        error: BaseException | None = None
        try:
            self.engine.add_request(prompt, params, request_id=rid, cache_salt=salt, priority=priority)
        except PagedError as exc:
            error = exc
        self._call(_settle, accepted, error)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed")
            # The engine ended (and names) the requests of the failed step; the others keep going.
            failed = self._take_failed()
            if not failed:
                # Nothing was attributed (an engine without per-request failures): fail every request, keep serving.
                ids = list(self.engine.groups)
                self.engine.abort_request(ids)
                self._call(self._fail_streams, RuntimeError(f"engine step failed: {exc!r}"), ids)
                return
            self._call(self._fail_requests, failed)
            return
        self._steps += 1
        failed = self._take_failed()
        if failed:
            # Those requests come back as finished outputs with an error: their streams get the error instead.
            outputs = [out for out in outputs if out.request_id not in failed]
            self._call(self._fail_requests, failed)
        if outputs:
            self._call(self._deliver, outputs, time.monotonic())

    def _take_failed(self) -> dict[str, str]:
        """The requests the engine's last step ended on an error (request id -> why), logged here."""
        failed: dict[str, str] = dict(getattr(self.engine, "failed", None) or {})
        for rid, why in failed.items():
            log.error("request %s failed: %s", rid, why)
        return failed

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed between the check and the call (shutdown)
                pass

    # ---- back on the event loop -----------------------------------------
    def _deliver(self, outputs: list[RequestOutput], now: float) -> None:
        delivered = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by the server while this step ran
            stream.queue.put_nowait(out)
            delivered.append(out)
            if out.finished:
                del self._streams[out.request_id]
        if self.observer is not None and delivered:
            self.observer(delivered, now)

    def _fail_requests(self, failed: dict[str, str]) -> None:
        """End only these requests' streams, each with a :class:`RequestFailedError` saying why."""
        for rid, why in failed.items():
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.queue.put_nowait(RequestFailedError(why))

    def _fail_streams(self, exc: BaseException, ids: list[str] | None = None) -> None:
        for rid in list(self._streams) if ids is None else ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.queue.put_nowait(exc)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
