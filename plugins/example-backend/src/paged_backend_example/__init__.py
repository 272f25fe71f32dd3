"""paged-backend-example: a minimal out-of-tree paged attention backend (the vendor template)."""

from __future__ import annotations

from paged_backend_example.backend import ExampleBackend
from paged_backend_example.recording import GraphCalls, RecordingCompiledStrategy

__all__ = ["ExampleBackend", "GraphCalls", "RecordingCompiledStrategy"]
