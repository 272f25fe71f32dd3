"""The entry point ``paged_core.backends: rocm`` loads this module; the hook lists the backend."""

from __future__ import annotations

from paged_backend_rocm.backend import RocmBackend
from paged_core.api import AttentionBackend, hookimpl


@hookimpl
def paged_register_backends() -> list[type[AttentionBackend]]:
    """The backends this distribution provides."""
    return [RocmBackend]
