"""The stable public surface of paged-core.

Backend packages import from here and nowhere else in ``paged_core``; the
names below follow the plugin API compatibility promise in
:mod:`paged_core.contract.version`.
"""

from __future__ import annotations

from paged_core.config import CacheConfig, GraphConfig, ModelConfig, ParallelConfig, SchedulerConfig
from paged_core.contract.backend import AttentionBackend, Availability
from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities, GraphSupport
from paged_core.contract.fused_ops import FusedOps, PackedLinear
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy, StepFn
from paged_core.contract.metadata import AttentionMetadata, build_attention_metadata
from paged_core.contract.version import PLUGIN_API_VERSION, SUPPORTED_PLUGIN_API_VERSIONS
from paged_core.engine.config import EngineConfig
from paged_core.engine.engine import LLMEngine
from paged_core.engine.llm import LLM
from paged_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from paged_core.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigError,
    PagedError,
    RequestRejectedError,
    UnsupportedConfigError,
)
from paged_core.graph import (
    CompiledStrategy,
    DeviceGraphStrategy,
    GraphRunner,
    GraphStats,
    StaticInput,
    capture_sizes,
)
from paged_core.memory.block import KVBlock
from paged_core.memory.block_pool import BlockPool
from paged_core.memory.kv_cache_manager import KVCacheManager
from paged_core.memory.stats import PrefixCacheStats
from paged_core.reference.backend import ReferenceBackend
from paged_core.reference.dense import dense_causal_attention
from paged_core.registry import BackendRecord, BackendRegistry, BackendStatus, hookimpl, load_registry
from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.params import SamplingParams
from paged_core.sampling.sampler import Sampler, SamplerOutput
from paged_core.sampling.state import SamplingState
from paged_core.sched.output import CachedRequestData, NewRequestData, RequestUpdate, SchedulerOutput
from paged_core.sched.request import Request, RequestStatus
from paged_core.sched.scheduler import Scheduler
from paged_core.text.detokenizer import IncrementalDetokenizer
from paged_core.text.stop import StopStringChecker

__all__ = [
    "LLM",
    "PLUGIN_API_VERSION",
    "SUPPORTED_PLUGIN_API_VERSIONS",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "Availability",
    "BackendCapabilities",
    "BackendNotFoundError",
    "BackendRecord",
    "BackendRegistry",
    "BackendStatus",
    "BackendUnavailableError",
    "BlockPool",
    "CacheConfig",
    "CachedRequestData",
    "CompiledStrategy",
    "CompletionOutput",
    "ConfigError",
    "DeviceGraphStrategy",
    "EagerStrategy",
    "EngineConfig",
    "FusedOps",
    "GraphCaptureStrategy",
    "GraphConfig",
    "GraphRunner",
    "GraphStats",
    "GraphSupport",
    "IncrementalDetokenizer",
    "KVBlock",
    "KVCacheManager",
    "LLMEngine",
    "ModelConfig",
    "NewRequestData",
    "PackedLinear",
    "PagedError",
    "ParallelConfig",
    "PrefixCacheStats",
    "ReferenceBackend",
    "Request",
    "RequestMetrics",
    "RequestOutput",
    "RequestRejectedError",
    "RequestStatus",
    "RequestUpdate",
    "Sampler",
    "SamplerOutput",
    "SamplingParams",
    "SamplingState",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "StaticInput",
    "StepFn",
    "StopStringChecker",
    "TokenLogprobs",
    "UnsupportedConfigError",
    "build_attention_metadata",
    "capture_sizes",
    "dense_causal_attention",
    "hookimpl",
    "load_registry",
]
