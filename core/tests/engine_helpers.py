"""Small builders shared by the engine tests."""

from __future__ import annotations

from typing import Any

from paged_core.frontend.llm_engine import LLMEngine
from paged_core.frontend.outputs import RequestOutput

VOCAB = 260
"""The tiny model's vocabulary: 256 bytes, <s>, </s>, and two ids no text maps to."""
BOS, EOS = 256, 257


def make_engine(loaded: Any, **overrides: Any) -> LLMEngine:
    """A fresh engine (its own KV cache and scheduler) over the shared tiny weights."""
    from paged_core.engine_config import EngineConfig

    fields: dict[str, Any] = {
        "model": str(loaded.source.directory),
        "backend": loaded.backend.name,
        "graph_mode": "eager",
        "kv_cache_memory": "1MiB",
        "max_model_len": 48,
        "max_num_seqs": 32,
    }
    fields.update(overrides)
    return LLMEngine(EngineConfig.of(**fields), loaded)


def run_to_end(engine: LLMEngine, max_steps: int = 500) -> dict[str, RequestOutput]:
    """Step until no request is left; the last output of every request that finished (or failed)."""
    final: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return final
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    raise AssertionError(f"requests still unfinished after {max_steps} steps: {sorted(engine.core.sampled.groups)}")


def all_blocks_free(engine: LLMEngine) -> bool:
    """True when every usable KV block is back in the pool."""
    pool = engine.core.scheduler.kv.pool
    return bool(pool.num_free_blocks == pool.num_usable_blocks)
