"""Generation: the engine requests behind one HTTP request (one per prompt), merged into one event stream.

It also watches the connection: when the client goes away, every request
is aborted at once (freeing its KV blocks) and the stream ends. It holds the
HTTP request's admission ticket (its share of the in-flight bound) until it
closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from paged_core.engine_core.beam_params import BeamParams
from paged_core.errors import EngineDeadError, PagedError
from paged_core.frontend.outputs import RequestOutput
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams
from paged_core.serve.admission import Ticket
from paged_core.serve.errors import APIError, internal_error, rejected
from paged_core.serve.state import ServerState


class ClientGone(Exception):
    """The client closed the connection; its requests were aborted."""


class Generation:
    """Submits ``prompts`` (token ids) with ``params`` and yields ``(prompt_index, output)`` as steps finish."""

    def __init__(self, state: ServerState, request: Request, prefix: str) -> None:
        self.state = state
        self.request = request
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.request_ids: list[str] = []
        self._sink: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._pending: set[str] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._ticket: Ticket | None = None
        self._lora: LoRARequest | None = None

    def start(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        cache_salt: str | None,
        priority: int = 0,
        beam: BeamParams | None = None,
        lora: LoRARequest | None = None,
    ) -> None:
        """Send every prompt (validated by the route) and start watching the connection; nothing waits for the core.

        First the request's admission ticket grows to its number of sequences (prompts x ``n``): a 429 if that
        would exceed the in-flight bound. A request the core refuses surfaces in :meth:`events` as a 400. With
        ``lora`` every prompt runs on that adapter, held (see :class:`~paged_core.serve.lora.LoRARegistry`) until
        :meth:`close`: a 404 if it was unloaded since the route resolved it.
        """
        engine = self.state.engine
        self._admit(sum(p.n for p in params))
        try:
            if lora is not None:
                self.state.loras.acquire(lora)
                self._lora = lora
            for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
                rid = f"{self.id}-{i}"
                engine.add(rid, ids, p, cache_salt, priority, sink=self._sink, beam=beam, lora=lora)
                self.request_ids.append(rid)
                self._pending.add(rid)
        except EngineDeadError as exc:  # before PagedError, which it is: a dead core is a 503, never a 400
            self.close()
            raise APIError(503, str(exc)) from None
        except PagedError as exc:
            self.close()
            raise rejected(exc) from None
        except BaseException:
            self.close()
            raise
        self._watcher = asyncio.create_task(self._watch())

    def _admit(self, size: int) -> None:
        ticket: Ticket | None = getattr(self.request.state, "admission", None)
        if ticket is None or ticket.released:  # a route without the admit dependency: take a ticket here
            self._ticket = self.state.admission.acquire(size)
        else:
            ticket.adopt(size)
            self._ticket = ticket

    async def events(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs in arrival order, tagged with their prompt's index; raises :class:`ClientGone` on disconnect."""
        index = {rid: i for i, rid in enumerate(self.request_ids)}
        while self._pending:
            item = await self._sink.get()
            if isinstance(item, ClientGone):
                raise item
            if isinstance(item, EngineDeadError):
                raise APIError(503, str(item))
            if isinstance(item, PagedError):  # the core refused the request: the route's own 400, or an error event
                raise rejected(item)
            if isinstance(item, BaseException):
                raise internal_error(item, f"generation {self.id}")
            if item.finished:
                self._pending.discard(item.request_id)
            yield index[item.request_id], item

    def close(self) -> None:
        """Abort whatever has not finished and stop watching the connection (idempotent)."""
        for rid in self.request_ids:
            if rid not in self._pending:
                continue
            if self.state.engine.abort(rid):
                self.state.metrics.on_abort(rid)
            else:  # already failed by the engine thread: nothing to abort, only timing state to drop
                self.state.metrics.forget(rid)
        self._pending.clear()
        if self._ticket is not None:
            self._ticket.release()
        if self._lora is not None:  # after the aborts above: the core has them before any removal of the adapter
            lora, self._lora = self._lora, None
            self.state.loras.release(lora)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        self._watcher = None

    async def _watch(self) -> None:
        # The body was read in full already, so the next message can only be the disconnect.
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                message = await self.request.receive()
                if message["type"] == "http.disconnect":
                    break
            self._watcher = None
            self.close()
            self._sink.put_nowait(ClientGone())
