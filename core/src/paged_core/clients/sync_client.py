"""CoreClient: how a synchronous front end talks to an engine core, in-process or in a child process.

Both implementations take the same messages (:mod:`paged_core.engine_core.messages`) and give back the
same :class:`CoreOutputs`, so :class:`~paged_core.frontend.llm_engine.LLMEngine` cannot tell them apart.
"""

from __future__ import annotations

from typing import Any, Protocol

from paged_core.engine_core.core import EngineCore
from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest
from paged_core.errors import RequestRejectedError


class CoreClient(Protocol):
    """The synchronous client contract."""

    facts: CoreFacts

    def add(self, request: CoreRequest) -> None:
        """Queue a request; raises :class:`~paged_core.errors.RequestRejectedError` if the core refuses it."""

    def add_many(self, requests: list[CoreRequest]) -> dict[str, str]:
        """Queue requests at once (all admitted before the next step); the refused ones' ids and reasons."""

    def abort(self, abort: CoreAbort) -> None:
        """End requests or single sequences."""

    def step(self) -> CoreOutputs:
        """The next step's outputs (in-process: runs the step; multi-process: waits for the core's next one)."""

    def call(self, method: str) -> Any:
        """A utility call (``reset_prefix_cache``, ``stats``)."""

    def shutdown(self) -> None:
        """Stop the core and release its resources (idempotent)."""


class InProcClient:
    """The core in this process: :meth:`step` runs one step right here."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.facts = core.facts()

    def add(self, request: CoreRequest) -> None:
        self.core.add_request(request)

    def add_many(self, requests: list[CoreRequest]) -> dict[str, str]:
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
        return self.core.step()

    def call(self, method: str) -> Any:
        return self.core.call(method)

    def shutdown(self) -> None:
        self.core.close()
