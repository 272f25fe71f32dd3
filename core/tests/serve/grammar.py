"""Route tests' grammar checks: the session's compiler (see conftest's ``grammar_compiler``) installed in an app."""

from __future__ import annotations

from fastapi.testclient import TestClient

from paged_core.serve.constraints import RouteCompiler
from paged_core.structured.compiler import GrammarCompiler


class SharedGrammar(RouteCompiler):
    """The session's compiler behind a route compiler that leaves it open when an app shuts down."""

    def close(self) -> None:
        """Kept open: the next test's app uses it."""


def use_grammar(client: TestClient, compiler: GrammarCompiler) -> TestClient:
    """``client``'s app checking constraints with ``compiler``."""
    client.app.state.paged.grammar = SharedGrammar(lambda: compiler)  # type: ignore[attr-defined]
    return client
