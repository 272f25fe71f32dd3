"""The entry point ``paged_core.backends: cuda`` loads this module; the hook lists the backends.

Importing the tiers' modules is cheap: FlashInfer and flash_attn are imported only when one is constructed.
"""

from __future__ import annotations

from paged_backend_cuda.backend import CudaBackend
from paged_backend_cuda.flash_attn_backend import FlashAttnBackend
from paged_backend_cuda.flashinfer_backend import FlashInferBackend
from paged_core.api import AttentionBackend, hookimpl


@hookimpl
def paged_register_backends() -> list[type[AttentionBackend]]:
    """The backends this distribution provides: own kernels, FlashInfer, flash-attn."""
    return [CudaBackend, FlashInferBackend, FlashAttnBackend]
