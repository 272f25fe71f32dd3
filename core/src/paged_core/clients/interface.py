"""CoreClient: how a front end talks to an engine core, whoever the front end and wherever the core.

One interface, typed with the wire messages of :mod:`paged_core.engine_core.messages`: a front end sends
:class:`CoreRequest` and :class:`CoreAbort` and receives :class:`CoreOutputs`. Adds are never answered on their
own: a request the core refuses comes back in :attr:`CoreOutputs.refused`, so a front end streams as soon as it
sends. The two front ends read outputs in their own way, hence two refinements:

- :class:`SyncCoreClient`, pulled by :class:`~paged_core.frontend.llm_engine.LLMEngine`: :meth:`~SyncCoreClient.step`
  returns the core's next outputs (an in-process core runs the step right there);
- :class:`AsyncCoreClient`, pushed to :class:`~paged_core.serve.async_engine.AsyncEngine`: outputs are delivered
  on the event loop as the core makes them.

:func:`~paged_core.clients.factory.make_client` picks the implementation.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from paged_core.engine_core.messages import CoreAbort, CoreFacts, CoreOutputs, CoreRequest, SchedulerStats

OnOutputs = Callable[[CoreOutputs], None]
OnDead = Callable[[str], None]
OnFailed = Callable[[list[str], BaseException], None]
"""``on_failed(request_ids, error)``: end these requests' streams with ``error`` (one of several cores died)."""


class CoreClient(ABC):
    """What every client does: the core's facts and latest stats, adds, aborts, shutdown."""

    facts: CoreFacts
    stats: SchedulerStats

    @abstractmethod
    def add(self, requests: Sequence[CoreRequest]) -> dict[str, str]:
        """Send requests, admitted together before the core's next step; the refusals known at once (id -> why).

        A core in this process answers at once; any other answers in the next :class:`CoreOutputs`'s ``refused``
        (and returns ``{}`` here). Raises :class:`~paged_core.errors.EngineDeadError` once the core is gone.
        """

    @abstractmethod
    def abort(self, abort: CoreAbort) -> None:
        """End requests or single sequences (never blocks)."""

    @abstractmethod
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the core and release its resources (idempotent); afterwards nothing is delivered."""


class SyncCoreClient(CoreClient):
    """A client pulled by a synchronous front end."""

    @abstractmethod
    def step(self) -> CoreOutputs:
        """The next step's outputs (in-process: runs the step; otherwise: waits for the core's next one)."""

    @abstractmethod
    def call(self, method: str) -> Any:
        """A utility call (``reset_prefix_cache``, ``stats``, ``dropped_messages``)."""


class AsyncCoreClient(CoreClient):
    """A client that delivers outputs to an asyncio event loop; its calls never block the loop."""

    @abstractmethod
    def start(
        self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead, on_failed: OnFailed | None = None
    ) -> None:
        """Begin delivering every :class:`CoreOutputs` to ``on_outputs`` on ``loop`` (call on that loop).

        ``on_dead(why)`` reports the core's death on the loop. ``on_failed`` is for clients over several cores
        (data parallel), where one core's death ends only its own requests; a single-core client never calls it.
        """

    @abstractmethod
    async def call(self, method: str, *args: Any) -> Any:
        """A utility call (``reset_prefix_cache``, ``stats``; ``load_lora`` and ``remove_lora`` take ``args``)."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """True while the core serves."""
