"""The ``paged-lora`` run: the workload's requests on random adapters, on the base engine's loaded weights."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from paged_bench.engine_run import run_engine, warm_up
from paged_bench.lora import LORA, round_robin, write_adapters
from paged_bench.result import RunResult
from paged_bench.workloads import BenchRequest
from paged_core.engine_config import EngineConfig
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.lora.adapter import PROJECTIONS, model_shapes


def run_lora(
    base: LLMEngine,
    config: EngineConfig,
    requests: Sequence[BenchRequest],
    count: int,
    rank: int,
    seed: int,
    progress: bool = True,
) -> RunResult:
    """The ``paged-lora`` run: ``count`` adapters written to a temporary directory, an engine of ``config``
    (``enable_lora`` on) on ``base``'s loaded weights, warmed up on every adapter, then ``requests``
    round-robin over them. The run's ``lora`` figures record the adapters and the slot loads while timed."""
    if not config.model.enable_lora:
        raise ValueError("run_lora needs a config with enable_lora=True")
    shapes = model_shapes(base.loaded.model)
    with tempfile.TemporaryDirectory(prefix="paged-bench-lora-") as tmp:
        adapters = write_adapters(Path(tmp), shapes, count, rank, seed)
        engine = LLMEngine(config, base.loaded)
        try:
            slots = engine.core.runner.lora
            assert slots is not None  # enable_lora builds them
            warm_up(engine, adapters)
            loads = slots.loads
            run = run_engine(engine, requests, LORA, progress, loras=round_robin(len(requests), adapters))
            run.lora = {
                "adapters": count,
                "rank": rank,
                "targets": sorted({m for _, m in shapes if m in PROJECTIONS}, key=PROJECTIONS.index),
                "assignment": "round-robin",
                "max_loras": config.model.max_loras,
                "max_lora_rank": config.model.max_lora_rank,
                "slot_loads": slots.loads - loads,
            }
        finally:
            engine.shutdown()
    return run
