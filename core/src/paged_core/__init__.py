"""paged-core: KV-cache memory, scheduling and the backend contract for paged-attention serving.

The package exports what users of the engine need; backend vendors import from
:mod:`paged_core.api`, and everything else comes from its own module.

The engine's names (``LLM``, ``SamplingParams``, ...) are imported on first use: a plain
``pip install paged-core`` (what a backend vendor needs) lacks the ``[models]`` extra they
depend on, and ``import paged_core.api`` must not pull them in. Using one without that extra
raises :class:`paged_core.extras.MissingExtraError`, which says what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paged_core._lazy import lazy_getattr
from paged_core._version import __version__
from paged_core.errors import ConfigError, EngineDeadError, PagedError, RequestRejectedError

if TYPE_CHECKING:
    from paged_core.config import (
        CacheConfig,
        GraphConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
    )
    from paged_core.engine_config import EngineConfig
    from paged_core.frontend.beam_outputs import BeamSearchOutput, BeamSequence
    from paged_core.frontend.llm import LLM
    from paged_core.frontend.llm_engine import LLMEngine
    from paged_core.frontend.outputs import CompletionOutput, RequestMetrics, RequestOutput
    from paged_core.sampling.params import SamplingParams

# name -> module that defines it (imported on first access by __getattr__)
_LAZY: dict[str, str] = {
    "CacheConfig": "paged_core.config",
    "GraphConfig": "paged_core.config",
    "ModelConfig": "paged_core.config",
    "ParallelConfig": "paged_core.config",
    "SchedulerConfig": "paged_core.config",
    "SpeculativeConfig": "paged_core.config",
    "BeamSearchOutput": "paged_core.frontend.beam_outputs",
    "BeamSequence": "paged_core.frontend.beam_outputs",
    "EngineConfig": "paged_core.engine_config",
    "LLMEngine": "paged_core.frontend.llm_engine",
    "LLM": "paged_core.frontend.llm",
    "CompletionOutput": "paged_core.frontend.outputs",
    "RequestMetrics": "paged_core.frontend.outputs",
    "RequestOutput": "paged_core.frontend.outputs",
    "SamplingParams": "paged_core.sampling.params",
    "LoRARequest": "paged_core.lora.request",
}


__getattr__ = lazy_getattr("paged_core", _LAZY, globals(), extra="models")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "LoRARequest",
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
