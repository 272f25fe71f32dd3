"""Where data parallelism runs: only ``paged serve`` has several engine cores (one router in front of them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paged_core.errors import ConfigError

if TYPE_CHECKING:
    from paged_core.engine_config import EngineConfig

__all__ = ["require_one_engine_core"]


def require_one_engine_core(config: EngineConfig, where: str = "LLM") -> None:
    """Refuse ``data_parallel_size`` > 1 for ``where`` (the offline ``LLM``, one engine core in this process).

    Data parallelism needs a front end that routes requests over several cores: ``paged serve
    --data-parallel-size M``. Call this where an engine is built for one core.
    """
    dp = config.parallel.data_parallel_size
    if dp != 1:
        raise ConfigError(f"data_parallel_size={dp} runs in `paged serve`; {where} runs one engine core")
