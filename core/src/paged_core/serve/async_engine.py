"""AsyncEngine: the server's front end: input and output processing on the event loop, a core behind a client.

HTTP handlers :meth:`~AsyncEngine.add` requests and read their :class:`RequestStream`; the core
(a thread or a child process, see :mod:`paged_core.clients.factory`) sends token deltas, which
the :class:`~paged_core.frontend.output_processor.OutputProcessor` turns into cumulative outputs here. An add is
not answered: the stream starts at once, and a request the core refuses ends its stream with
:class:`~paged_core.errors.RequestRejectedError`. When the core dies every open stream ends with
:class:`EngineDeadError` naming the cause, and ``on_dead`` lets the server exit (so a supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from paged_core.clients.interface import AsyncCoreClient
from paged_core.engine_core.beam_params import BeamParams
from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats
from paged_core.errors import EngineDeadError, PagedError, RequestRejectedError
from paged_core.frontend.input_processor import InputProcessor
from paged_core.frontend.output_processor import OutputProcessor
from paged_core.frontend.outputs import RequestOutput
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams

log = logging.getLogger("paged.serve")

StepObserver = Callable[[list[RequestOutput], float], None]
Sink = asyncio.Queue[RequestOutput | BaseException]

__all__ = ["AsyncEngine", "EngineDeadError", "RequestFailedError", "RequestStream"]


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
    """Serves asyncio callers from one engine core.

    ``observer(outputs, step_end_time)`` is called on the event loop after every step that produced
    outputs (the server's metrics hang there); ``on_dead(why)`` once, if the core dies.
    """

    def __init__(
        self,
        client: AsyncCoreClient,
        tokenizer: Any | None,
        observer: StepObserver | None = None,
        on_dead: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.facts: CoreFacts = client.facts
        self.tokenizer = tokenizer
        self.input = InputProcessor(tokenizer, self.facts)
        self.output = OutputProcessor(tokenizer)
        self.observer = observer
        self.on_dead = on_dead
        self._streams: dict[str, RequestStream] = {}
        self._dead: str | None = None
        self._started = False
        self._stopped = False

    # ---- lifecycle (event loop side) ------------------------------------
    def start(self) -> None:
        """Start receiving from the core; call from the event loop that will read the outputs."""
        if self._started:
            raise RuntimeError("AsyncEngine already started")
        self._started = True
        self.client.start(asyncio.get_running_loop(), self._on_outputs, self._on_dead, self.fail_requests)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the core; pending requests end with :class:`EngineDeadError`."""
        if self._stopped:
            return
        self._stopped = True
        self.client.shutdown(timeout)
        self._fail_streams(EngineDeadError("server is shutting down"))

    @property
    def stats(self) -> SchedulerStats:
        """The core's latest scheduler statistics."""
        return self.client.stats

    @property
    def healthy(self) -> bool:
        """True while the core runs and has not died."""
        return self._started and not self._stopped and self._dead is None and self.client.alive

    @property
    def dead_reason(self) -> str | None:
        return self._dead

    @property
    def per_core(self) -> list[Any] | None:
        """Each core's :class:`.CoreStatus` when several serve (data parallel), else None."""
        per_core: list[Any] | None = getattr(self.client, "per_core", None)
        return per_core

    def core_health(self) -> list[dict[str, Any]] | None:
        """What ``/health`` lists per core when several serve (data parallel), else None."""
        report = getattr(self.client, "core_health", None)
        return None if report is None else list(report())

    @property
    def num_streams(self) -> int:
        """Requests the server is still waiting on."""
        return len(self._streams)

    # ---- requests (event loop side) -------------------------------------
    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        priority: int = 0,
        sink: Sink | None = None,
        beam: BeamParams | None = None,
        lora: LoRARequest | None = None,
    ) -> RequestStream:
        """Send a request (a beam search with ``beam``, on the adapter ``lora``) and return its stream at once;
        outputs go to ``sink`` if given.

        The input is the route's, validated where it entered (token ids, params bounded by the vocabulary, beam
        rules, priority): nothing is checked again here. A refusal by the core ends the stream with
        :class:`RequestRejectedError`; a dead engine or a request id in use raise here.
        """
        if not self.healthy:
            raise EngineDeadError(f"engine is not running ({self._dead or 'stopped'})")
        if request_id in self._streams:
            raise PagedError(f"request id {request_id!r} is already in use")
        request = CoreRequest(request_id, prompt, params, cache_salt, priority, time.monotonic(), beam=beam, lora=lora)
        stream = RequestStream(request_id, sink)
        self._streams[request_id] = stream
        self.output.add(request)
        try:
            refused = self.client.add([request])
        except BaseException:
            self._forget(request_id)
            raise
        if refused:
            self._forget(request_id)
            raise RequestRejectedError(refused[request_id])
        return stream

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.output.remove([request_id])

    def abort(self, request_id: str) -> bool:
        """Abort a request (its blocks are freed on the core's next turn); False if it was done."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        self.output.remove([request_id])
        if self.healthy:
            self.client.abort(CoreAbort(request_ids=[request_id]))
        return True

    def abort_all(self, exc: BaseException) -> int:
        """End every open request's stream with ``exc`` and abort it in the core (a drain ran out); how many."""
        ids = list(self._streams)
        self.fail_requests(ids, exc)
        if ids and self.healthy:
            self.client.abort(CoreAbort(request_ids=ids))
        return len(ids)

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block in the core (False if some are in use)."""
        return bool(await self.client.call("reset_prefix_cache"))

    async def load_lora(self, lora: LoRARequest) -> str | None:
        """Load and check ``lora`` in the core (every core, with data parallelism) now: None, or what is wrong."""
        if not self.healthy:
            raise EngineDeadError(f"engine is not running ({self._dead or 'stopped'})")
        result = await self.client.call("load_lora", lora.name, lora.id, lora.path)
        answers = result if isinstance(result, list) else [result]
        problem = next((str(a) for a in answers if a is not None), None)
        if problem is not None and len(answers) > 1:  # some cores may have taken it: leave none holding it
            await self.client.call("remove_lora", lora.id)
        return problem

    async def remove_lora(self, lora_id: int) -> None:
        """Make the core forget adapter ``lora_id`` (no request may still run on it); a dead core is left alone."""
        if self.healthy:
            await self.client.call("remove_lora", lora_id)

    # ---- from the core (event loop side) --------------------------------
    def _on_outputs(self, outputs: CoreOutputs) -> None:
        now = time.monotonic()
        for rid, why in outputs.refused.items():
            stream = self._streams.pop(rid, None)
            self.output.remove([rid])
            if stream is not None:
                stream.queue.put_nowait(RequestRejectedError(why))
        if outputs.step_error is not None:
            log.error("engine step failed: %s", outputs.step_error)
        for rid, why in outputs.failed.items():
            log.error("request %s failed: %s", rid, why)
        results, stopped = self.output.process(outputs)
        if stopped and self.healthy:
            self.client.abort(CoreAbort(sequences=stopped, stopped=True))
        delivered = []
        for out in results:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by the server while this step ran
            if out.error is not None:
                del self._streams[out.request_id]
                stream.queue.put_nowait(RequestFailedError(out.error))
                continue
            stream.queue.put_nowait(out)
            delivered.append(out)
            if out.finished:
                del self._streams[out.request_id]
        if self.observer is not None and delivered:
            self.observer(delivered, now)

    def fail_requests(self, request_ids: list[str], exc: BaseException) -> None:
        """End these requests' streams with ``exc`` (their core died while others serve on); unknown ids are skipped."""
        for rid in request_ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.queue.put_nowait(exc)
        self.output.remove(request_ids)

    def _on_dead(self, why: str) -> None:
        if self._dead is not None:
            return
        self._dead = why
        self._fail_streams(EngineDeadError(why))
        self.output.remove(list(self.output.requests))
        if self.on_dead is not None:
            self.on_dead(why)

    def _fail_streams(self, exc: BaseException) -> None:
        for rid in list(self._streams):
            stream = self._streams.pop(rid)
            stream.queue.put_nowait(exc)
