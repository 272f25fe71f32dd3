"""The vendor contract: what a backend package (and the conformance suite) imports.

Backend packages (their tests and benchmarks included) import from here and
nowhere else in ``paged_core``: hence the reference backend, the oracle a
backend's tests compare against, and ``load_registry``, which a backend's tests
use to check that its entry point loads. The names below follow the plugin API compatibility promise in
:mod:`paged_core.contract.version`. Users' names (``LLM``, ``SamplingParams``,
...) live on the package itself, :mod:`paged_core`; everything else is imported
from its own module.
"""

from __future__ import annotations

from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities, GraphSupport
from paged_core.contract.device import DeviceHooks, TorchDeviceHooks, default_device_hooks
from paged_core.contract.fused_ops import DENSE_LINEAR_KINDS, LINEAR_KINDS, FusedOps, PackedLinear, linear_kind
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy, StepFn
from paged_core.contract.inputs import check_attention_inputs, check_default_cache, check_write_inputs
from paged_core.contract.metadata import AttentionMetadata, build_attention_metadata
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigError,
    PagedError,
    UnsupportedConfigError,
    WeightFormatError,
)
from paged_core.graph import CompiledStrategy, DeviceGraphStrategy, GraphRunner, StaticInput
from paged_core.quant import FORMATS as LINEAR_FORMATS
from paged_core.quant import (
    QuantizedWeight,
    WeightFormat,
    dequantize,
    quantize_blocks,
    random_packed,
    reference_linear,
    round_activations_q8,
)
from paged_core.reference.backend import ReferenceBackend
from paged_core.reference.fused import ReferenceFusedOps
from paged_core.registry import hookimpl, load_registry

__all__ = [
    "DENSE_LINEAR_KINDS",
    "LINEAR_FORMATS",
    "LINEAR_KINDS",
    "PLUGIN_API_VERSION",
    "SUPPORTED_PLUGIN_API_VERSIONS",
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
    "GraphRunner",
    "GraphSupport",
    "PackedLinear",
    "PagedError",
    "QuantizedWeight",
    "ReferenceBackend",
    "ReferenceFusedOps",
    "StaticInput",
    "StepFn",
    "TorchDeviceHooks",
    "UnsupportedConfigError",
    "WeightFormat",
    "WeightFormatError",
    "build_attention_metadata",
    "check_attention_inputs",
    "check_default_cache",
    "check_write_inputs",
    "default_device_hooks",
    "dequantize",
    "hookimpl",
    "linear_kind",
    "load_registry",
    "quantize_blocks",
    "random_packed",
    "reference_linear",
    "round_activations_q8",
]
