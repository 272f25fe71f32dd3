"""Fixtures for serve unit tests: the app around a :class:`FakeEngine`, driven by Starlette's TestClient."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from paged_core.serve import ServeConfig, build_app
from paged_core.structured.compiler import GrammarCompiler

from .fake_engine import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(build_app(engine, ServeConfig(max_n=4, max_tokens_limit=50))) as c:
        yield c


@pytest.fixture(scope="session")
def grammar_compiler() -> Iterator[GrammarCompiler]:
    """A compiler for the embedded model's tokenizer (the fake engines' own tokenizers are not HF ones)."""
    from paged_core.loading.loader import load_tokenizer, resolve_source

    with GrammarCompiler(load_tokenizer(resolve_source(None))) as compiler:
        yield compiler
