"""DrainingServer: uvicorn's server, whose stop signal gives in-flight requests a drain and then ends them cleanly.

uvicorn alone cancels the handlers' tasks when its graceful timeout runs out: each open stream is cut
mid-write (the client sees a broken chunked body, the log a traceback per stream). Here, ``drain`` seconds
(``--drain-timeout``) after the first SIGTERM or Ctrl-C, every request still open ends with an error event
(``[DONE]`` after it) and is aborted in the core; uvicorn's own timeout stays behind as a backstop for
handlers that are not streams.
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from paged_core.errors import EngineDeadError

if TYPE_CHECKING:
    from paged_core.serve.async_engine import AsyncEngine

log = logging.getLogger("paged.serve")

BACKSTOP = 3.0
"""Seconds after the drain before uvicorn cancels what still runs (a handler that ignored its ended stream)."""


class DrainingServer(uvicorn.Server):
    """A :class:`uvicorn.Server` that ends ``engine``'s open requests ``drain`` seconds after a stop signal."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, drain: float) -> None:
        config.timeout_graceful_shutdown = int(drain + BACKSTOP)
        super().__init__(config)
        self.engine = engine
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if not self._draining and self._loop is not None:
            self._draining = True
            # A signal handler may run between any two bytecodes: hand the timer to the loop.
            self._loop.call_soon_threadsafe(self._loop.call_later, self.drain, self._end_open_requests)

    def _end_open_requests(self) -> None:
        ended = self.engine.abort_all(
            EngineDeadError(f"server is shutting down: the request did not finish within the {self.drain:g} s drain")
        )
        if ended:
            log.warning("drain of %g s over: %d request(s) ended with an error", self.drain, ended)
