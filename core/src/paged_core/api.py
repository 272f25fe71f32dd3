"""The stable public surface of paged-core.

Backend packages import from here and nowhere else in ``paged_core``; the
names below follow the plugin API compatibility promise in
:mod:`paged_core.contract.version`.
"""

from __future__ import annotations

from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities, GraphSupport
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy, StepFn
from paged_core.contract.metadata import AttentionMetadata, build_attention_metadata
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigError,
    PagedError,
    RequestRejectedError,
    UnsupportedConfigError,
)

__all__ = [
    "PLUGIN_API_VERSION",
    "SUPPORTED_PLUGIN_API_VERSIONS",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "Availability",
    "BackendCapabilities",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "ConfigError",
    "EagerStrategy",
    "GraphCaptureStrategy",
    "GraphSupport",
    "PagedError",
    "RequestRejectedError",
    "StepFn",
    "UnsupportedConfigError",
    "build_attention_metadata",
]
