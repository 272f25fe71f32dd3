"""Per-token negative log-likelihood of a fixed text: through our engine's paged forward, and through transformers.

The engine's figure runs the engine's own model path (fused decoder or
transformers' modules, with the backend's paged attention and linear
kernels, packed weights included) over the text as chunked prefill: each
chunk attends to the previous ones through the paged KV cache. The
transformers figure is one plain forward of the whole text on whatever model
it is given (e.g. the same GGUF dequantized to fp32). Both score token ``i+1``
from the logits at ``i``.
"""

from __future__ import annotations

from typing import Any

import torch

from paged_core.contract.metadata import build_attention_metadata


def _nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))


def engine_nll(llm: Any, token_ids: list[int], chunk: int = 256) -> float:
    """Mean NLL per predicted token of ``token_ids`` through ``llm``'s engine (an ``LLM`` or an ``LLMEngine``).

    It writes the KV of the engine's first blocks, so the engine must be idle; its
    prefix cache is reset first (cached blocks there would otherwise be overwritten).
    Keys and values are read back from that cache, so its dtype (``kv_cache_dtype``) counts.
    """
    engine = llm.engine if hasattr(llm, "engine") else llm
    if not engine.reset_prefix_cache():
        raise RuntimeError("engine_nll needs an idle engine (requests are running)")
    runner = engine.core.runner
    block_size = runner.block_size
    blocks = -(-len(token_ids) // block_size)
    num_blocks = int(engine.core.scheduler.kv.pool.num_blocks)
    if blocks + 1 > num_blocks:
        raise ValueError(f"{len(token_ids)} tokens need {blocks} KV blocks; the engine has {num_blocks - 1}")
    table = list(range(1, blocks + 1))  # block 0 is the null block
    ids = torch.tensor(token_ids, dtype=torch.int64, device=runner.device)
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(token_ids), chunk):
            end = min(start + chunk, len(token_ids))
            meta = build_attention_metadata(
                [end - start], [end], [table[: -(-end // block_size)]], block_size, device=runner.device
            )
            positions = torch.arange(start, end, device=runner.device)
            logits = runner.forward_impl.forward(meta, ids[start:end], positions, runner.kv_caches, None)
            last = min(end, len(token_ids) - 1)
            if last > start:
                total += _nll_sum(logits[: last - start], ids[start + 1 : last + 1])
                count += last - start
    return total / count


def transformers_nll(model: Any, token_ids: list[int]) -> float:
    """Mean NLL per predicted token of ``token_ids`` from one transformers forward."""
    ids = torch.tensor([token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]
    return _nll_sum(logits[:-1], ids[0, 1:]) / (len(token_ids) - 1)
