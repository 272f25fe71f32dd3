"""BlockingClient: a synchronous front end's client over a :class:`~paged_core.clients.transport.Transport`.

``LLM(..., multiprocess=True)`` runs it over a core process: :meth:`~BlockingClient.step` blocks for the core's
next outputs, :meth:`~BlockingClient.call` for its answer. Messages that arrive while waiting for something else
are kept in order, so no output is lost.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from typing import Any

from paged_core.clients.interface import SyncCoreClient
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

POLL_MS = 100
"""How often a waiting caller checks that the core is still alive."""


class BlockingClient(SyncCoreClient):
    """Blocking calls to one core over ``transport``; refusals come in the outputs (see :class:`SyncCoreClient`)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.facts = transport.wait_ready()
        self.stats = transport.stats
        self._outputs: collections.deque[CoreOutputs] = collections.deque()
        self._results: dict[int, CoreUtilityResult] = {}
        self._calls = itertools.count()

    def _pump(self) -> None:
        """Wait for one message and file it."""
        message = None
        while message is None:
            message = self.transport.recv(POLL_MS)
        if isinstance(message, CoreOutputs):
            self._outputs.append(message)
        elif isinstance(message, CoreUtilityResult):
            self._results[message.call_id] = message

    def add(self, requests: Sequence[CoreRequest]) -> dict[str, str]:
        if len(requests) == 1:
            self.transport.send(requests[0])
        elif requests:
            self.transport.send(CoreRequests(list(requests)))
        return {}

    def abort(self, abort: CoreAbort) -> None:
        self.transport.send(abort)

    def step(self) -> CoreOutputs:
        while not self._outputs:
            self._pump()
        outputs = self._outputs.popleft()
        self.stats = outputs.stats
        return outputs

    def call(self, method: str) -> Any:
        call_id = next(self._calls)
        self.transport.send(CoreUtility(call_id, method))
        while call_id not in self._results:
            self._pump()
        result = self._results.pop(call_id)
        if result.error is not None:
            raise EngineDeadError(result.error) if not self.transport.alive else RuntimeError(result.error)
        return result.result

    def shutdown(self, timeout: float = 5.0) -> None:
        self.transport.close(timeout)
