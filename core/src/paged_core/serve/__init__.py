"""The OpenAI-compatible server behind ``paged serve`` (the ``paged-core[serve]`` extra).

Names are imported on first use, so that ``paged_core.serve.settings`` (which ``paged serve``
reads to build its parser) stays importable on an install without the server's libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paged_core._lazy import lazy_getattr

if TYPE_CHECKING:
    from paged_core.serve.app import build_app
    from paged_core.serve.async_engine import AsyncEngine, EngineDeadError, RequestStream
    from paged_core.serve.server import run_server
    from paged_core.serve.settings import ServeConfig

_LAZY: dict[str, str] = {
    "build_app": "paged_core.serve.app",
    "AsyncEngine": "paged_core.serve.async_engine",
    "EngineDeadError": "paged_core.serve.async_engine",
    "RequestStream": "paged_core.serve.async_engine",
    "ServeConfig": "paged_core.serve.settings",
    "run_server": "paged_core.serve.server",
}


__getattr__ = lazy_getattr("paged_core.serve", _LAZY, globals())

__all__ = ["AsyncEngine", "EngineDeadError", "RequestStream", "ServeConfig", "build_app", "run_server"]
