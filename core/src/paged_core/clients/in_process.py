"""InProcClient: the core in the caller's process and thread; :meth:`~InProcClient.step` runs one step right here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from paged_core.clients.interface import SyncCoreClient
from paged_core.engine_core.messages import CoreAbort, CoreOutputs, CoreRequest
from paged_core.errors import RequestRejectedError

if TYPE_CHECKING:
    from paged_core.engine_core.core import EngineCore


class InProcClient(SyncCoreClient):
    """``LLM``'s default: the front end validated every request, so the core is handed them as they are."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.facts = core.facts()
        self.stats = core.stats()

    def add(self, requests: Sequence[CoreRequest]) -> dict[str, str]:
        refused = {}
        for request in requests:
            try:
                self.core.add_request(request)
            except RequestRejectedError as exc:
                refused[request.request_id] = str(exc)
        return refused

    def abort(self, abort: CoreAbort) -> None:
        self.core.abort(abort)

    def step(self) -> CoreOutputs:
        outputs = self.core.step()
        self.stats = outputs.stats
        return outputs

    def call(self, method: str) -> Any:
        return self.core.call(method)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.core.close()
