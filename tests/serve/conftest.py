"""Fixtures for server tests: the tiny chat model, built once, and its loaded weights shared by every server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .serve_helpers import save_tiny_chat_model

# The C++ CPU backend when installed (fast), else the pure-torch reference.
BACKENDS = ("cpu", "reference")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_model(tmp_path_factory.mktemp("serve-model"))


@pytest.fixture(scope="session")
def backend_name() -> str:
    from paged_core.registry import load_registry

    names = {r.name for r in load_registry().records() if r.selectable}
    return next(b for b in BACKENDS if b in names)


@pytest.fixture(scope="session")
def loaded(tiny_model_dir: Path, backend_name: str) -> Any:
    """Weights and tokenizer loaded once; each server gets a fresh KV cache and scheduler around them."""
    from paged_core.engine_config import EngineConfig
    from paged_core.engine_core.core import EngineCore

    return EngineCore(EngineConfig.of(model=str(tiny_model_dir), backend=backend_name, kv_cache_memory="2MiB")).loaded
