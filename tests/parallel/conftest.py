"""Fixtures for tensor-parallel tests: the tiny Llama saved once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tp_helpers import save_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tp"))
