"""ServerState: what every route needs (engine, metrics, tokenizer, limits), hung on ``app.state.paged``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from paged_core.lora.request import LoRARequest
from paged_core.serve.admission import Admission
from paged_core.serve.async_engine import AsyncEngine
from paged_core.serve.constraints import RouteCompiler
from paged_core.serve.errors import APIError
from paged_core.serve.lora import LoRARegistry
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
    loras: LoRARegistry = field(init=False)
    """The LoRA adapters served beside the base model (``--lora-modules`` and runtime loads)."""
    startup_error: str | None = None
    """Why the app failed to start (a ``--lora-modules`` adapter that did not load), logged in one line."""

    def __post_init__(self) -> None:
        running = int(self.engine.facts.max_num_seqs)
        self.admission = Admission(
            running, self.config.max_queued_requests, self.metrics.set_in_flight, self.metrics.count_refusal
        )
        self.metrics.in_flight_limit.set(self.admission.capacity)
        self.grammar = RouteCompiler(self._grammar_compiler)
        self.loras = LoRARegistry(self.engine, self.model_name)

    def _grammar_compiler(self) -> GrammarCompiler:
        from paged_core.structured.compiler import GrammarCompiler

        return GrammarCompiler(self.engine.tokenizer, int(self.engine.facts.vocab_size))

    def check_model(self, name: str | None, required: bool = True) -> LoRARequest | None:
        """The LoRA adapter the request's ``model`` names (None: the base model, or no name where not
        ``required``); a 404 (as OpenAI answers) for a model this server does not serve."""
        if name is None and not required:
            return None
        if name is None:  # the schema makes it required; kept for callers that skip it
            raise APIError(400, "missing required parameter: 'model'", param="model")
        return self.loras.resolve(name)

    def served_name(self, lora: LoRARequest | None) -> str:
        """The ``model`` a response names: the adapter's name, or the base model's served name."""
        return self.model_name if lora is None else lora.name


def get_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    state: ServerState = request.app.state.paged
    return state
