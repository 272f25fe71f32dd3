"""The vendor contract: what a backend package implements or calls, and nothing else.

A backend imports from here and nowhere else in ``paged_core``: the backend base class and its
capabilities, the attention metadata (and its builder) and the input checks, the fused ops and
the weight formats and kinds they declare, the graph-capture strategy interface with the built-in
strategies a backend may return, the device hooks, the errors, the plugin API version and
``hookimpl``. The names below follow the plugin API compatibility promise in
:mod:`paged_core.contract.version`.

Oracles, test data and the test harness (the reference backend, ``dequantize``,
``random_packed``, ``GraphRunner``, ``load_registry``, ...) live in :mod:`paged_core.testing`;
users' names (``LLM``, ``SamplingParams``, ...) on the package itself, :mod:`paged_core`.
"""

from __future__ import annotations

from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities, GraphSupport
from paged_core.contract.device import DeviceHooks, TorchDeviceHooks, default_device_hooks
from paged_core.contract.fused_ops import (
    DENSE_LINEAR_KINDS,
    LINEAR_KINDS,
    FusedOps,
    PackedLinear,
    head_rotation,
    linear_kind,
)
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy, StepFn
from paged_core.contract.inputs import check_attention_inputs, check_default_cache, check_write_inputs
from paged_core.contract.kv_quant import QUANTIZED_KV_DTYPES, dequantize_kv, is_quantized_kv, quantize_kv
from paged_core.contract.metadata import AttentionMetadata, build_attention_metadata
from paged_core.contract.moe import (
    Activation,
    MoERouting,
    PackedExperts,
    check_experts_inputs,
    check_moe_inputs,
    route_experts,
)
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigError,
    PagedError,
    UnsupportedConfigError,
    WeightFormatError,
)
from paged_core.graph import CompiledStrategy, DeviceGraphStrategy
from paged_core.quant import FORMATS as LINEAR_FORMATS
from paged_core.quant import QuantizedWeight, WeightFormat
from paged_core.registry import hookimpl

__all__ = [
    "DENSE_LINEAR_KINDS",
    "LINEAR_FORMATS",
    "LINEAR_KINDS",
    "PLUGIN_API_VERSION",
    "QUANTIZED_KV_DTYPES",
    "SUPPORTED_PLUGIN_API_VERSIONS",
    "Activation",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "Availability",
    "BackendCapabilities",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "CompiledStrategy",
    "ConfigError",
    "DeviceGraphStrategy",
    "DeviceHooks",
    "EagerStrategy",
    "FusedOps",
    "GraphCaptureStrategy",
    "GraphSupport",
    "MoERouting",
    "PackedExperts",
    "PackedLinear",
    "PagedError",
    "QuantizedWeight",
    "StepFn",
    "TorchDeviceHooks",
    "UnsupportedConfigError",
    "WeightFormat",
    "WeightFormatError",
    "build_attention_metadata",
    "check_attention_inputs",
    "check_default_cache",
    "check_experts_inputs",
    "check_moe_inputs",
    "check_write_inputs",
    "default_device_hooks",
    "dequantize_kv",
    "head_rotation",
    "hookimpl",
    "is_quantized_kv",
    "linear_kind",
    "quantize_kv",
    "route_experts",
]
