"""The OpenAI-compatible server behind ``paged serve`` (the ``paged-core[serve]`` extra).

Names are imported on first use, so that ``paged_core.serve.config`` (which ``paged serve``
reads to build its parser) stays importable on an install without the server's libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paged_core.serve.app import build_app
    from paged_core.serve.async_engine import AsyncEngine, EngineDeadError, RequestStream
    from paged_core.serve.config import ServeConfig
    from paged_core.serve.server import run_server

_LAZY: dict[str, str] = {
    "build_app": "paged_core.serve.app",
    "AsyncEngine": "paged_core.serve.async_engine",
    "EngineDeadError": "paged_core.serve.async_engine",
    "RequestStream": "paged_core.serve.async_engine",
    "ServeConfig": "paged_core.serve.config",
    "run_server": "paged_core.serve.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paged_core.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["AsyncEngine", "EngineDeadError", "RequestStream", "ServeConfig", "build_app", "run_server"]
