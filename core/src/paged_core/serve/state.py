"""ServerState: what every route needs (engine, metrics, tokenizer, limits), hung on ``app.state.paged``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from paged_core.serve.admission import Admission
from paged_core.serve.async_engine import AsyncEngine
from paged_core.serve.constraints import RouteCompiler
from paged_core.serve.errors import APIError
from paged_core.serve.metrics import ServerMetrics
from paged_core.serve.settings import ServeConfig
from paged_core.serve.tokens import Tokens

if TYPE_CHECKING:
    from paged_core.structured.compiler import GrammarCompiler


@dataclass
class ServerState:
    """One server's shared objects."""

    config: ServeConfig
    engine: AsyncEngine
    metrics: ServerMetrics
    tokens: Tokens
    model_name: str
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))
    admission: Admission = field(init=False)
    """The in-flight bound of generation requests (``max_num_seqs + max_queued_requests`` sequences)."""
    grammar: RouteCompiler = field(init=False)
    """Compiles each request's constraint once, for this model's tokenizer (built on the first one)."""

    def __post_init__(self) -> None:
        running = int(self.engine.facts.max_num_seqs)
        self.admission = Admission(
            running, self.config.max_queued_requests, self.metrics.set_in_flight, self.metrics.count_refusal
        )
        self.metrics.in_flight_limit.set(self.admission.capacity)
        self.grammar = RouteCompiler(self._grammar_compiler)

    def _grammar_compiler(self) -> GrammarCompiler:
        from paged_core.structured.compiler import GrammarCompiler

        return GrammarCompiler(self.engine.tokenizer, int(self.engine.facts.vocab_size))

    def check_model(self, name: str | None, required: bool = True) -> None:
        """A 404 (as OpenAI answers) for a model this server does not serve."""
        if name is None and not required:
            return
        if name != self.model_name:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )


def get_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    state: ServerState = request.app.state.paged
    return state
