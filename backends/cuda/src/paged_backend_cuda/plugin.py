"""The entry point ``paged_core.backends: cuda`` loads this module; the hook lists the backends."""

from __future__ import annotations

from paged_backend_cuda.backend import CudaBackend
from paged_core.api import AttentionBackend, hookimpl


@hookimpl
def paged_register_backends() -> list[type[AttentionBackend]]:
    """The backends this distribution provides."""
    return [CudaBackend]
