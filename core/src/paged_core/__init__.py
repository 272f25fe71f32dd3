"""paged-core: KV-cache memory, scheduling and the backend contract for paged-attention serving.

The package exports what users of the engine need; backend vendors import from
:mod:`paged_core.api`, and everything else comes from its own module.
"""

from __future__ import annotations

from paged_core.config import (
    CacheConfig,
    GraphConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from paged_core.engine.beam_outputs import BeamSearchOutput, BeamSequence
from paged_core.engine.config import EngineConfig
from paged_core.engine.engine import LLMEngine
from paged_core.engine.llm import LLM
from paged_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from paged_core.errors import ConfigError, EngineDeadError, PagedError, RequestRejectedError
from paged_core.sampling.params import SamplingParams

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "BeamSearchOutput",
    "BeamSequence",
    "CacheConfig",
    "CompletionOutput",
    "ConfigError",
    "EngineConfig",
    "EngineDeadError",
    "GraphConfig",
    "LLMEngine",
    "ModelConfig",
    "PagedError",
    "ParallelConfig",
    "RequestMetrics",
    "RequestOutput",
    "RequestRejectedError",
    "SamplingParams",
    "SchedulerConfig",
    "SpeculativeConfig",
    "__version__",
]
