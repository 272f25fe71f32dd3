"""The OpenAI-compatible server behind ``paged serve``."""

from paged_core.serve.app import build_app
from paged_core.serve.async_engine import AsyncEngine, EngineDeadError, RequestStream
from paged_core.serve.config import ServeConfig
from paged_core.serve.server import run_server

__all__ = ["AsyncEngine", "EngineDeadError", "RequestStream", "ServeConfig", "build_app", "run_server"]
