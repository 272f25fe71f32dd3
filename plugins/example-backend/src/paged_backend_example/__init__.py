"""paged-backend-example: a minimal out-of-tree paged attention backend (the vendor template)."""

from __future__ import annotations

from paged_backend_example.backend import ExampleBackend

__all__ = ["ExampleBackend"]
