"""paged-core: KV-cache memory, scheduling and the backend contract for paged-attention serving."""

from __future__ import annotations

from paged_core.api import *  # noqa: F403 - the package re-exports the public surface
from paged_core.api import __all__ as _api_all

__version__ = "0.1.0"
__all__ = [*_api_all, "__version__"]
