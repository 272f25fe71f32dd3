"""The profiling step: peak activation memory of the largest step, measured before sizing the KV cache."""

from __future__ import annotations

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.runner.batch import BatchBuilder, RowState
from paged_core.runner.forward import ModelForward


def profile_peak_bytes(
    forward: ModelForward,
    backend: AttentionBackend,
    specs: list[AttentionSpec],
    dtype: torch.dtype,
    block_size: int,
    num_tokens: int,
    max_model_len: int,
    kv_dtype: torch.dtype | None = None,
) -> int:
    """Device memory in use at the peak of one ``num_tokens``-token prefill (0 on the host or where unmeasurable).

    Runs the model once over a throwaway cache just large enough for that step,
    so the real KV budget can be what is left after weights and activations.
    The step's tokens are split into prompts of at most ``max_model_len`` tokens
    (a longer one would run past the model's positions). The throwaway cache is in ``kv_dtype`` (default
    ``dtype``), the KV cache's dtype, so a quantized cache's dequantizing attention is what is measured.
    Goes through the backend's device hooks, so any device whose hooks measure peaks (CUDA, ROCm, XPU by
    default) is profiled.
    """
    device, hooks = backend.device, backend.device_hooks()
    if hooks.host:
        return 0
    lengths = [min(max_model_len, num_tokens - start) for start in range(0, num_tokens, max_model_len)]
    per_row = -(-max(lengths) // block_size)
    cache_dtype = kv_dtype if kv_dtype is not None else dtype
    caches = [backend.allocate_kv_cache(per_row * len(lengths) + 1, block_size, s, cache_dtype) for s in specs]
    rows = [
        (
            f"profile-{i}",
            RowState(
                token_ids=[0] * n, block_ids=[list(range(1 + i * per_row, 1 + (i + 1) * per_row))], num_computed=0
            ),
            n,
        )
        for i, n in enumerate(lengths)
    ]
    batch = BatchBuilder(num_tokens, len(rows), per_row, block_size, device).build(rows)
    hooks.synchronize()
    hooks.reset_peak_memory()
    with torch.inference_mode():
        backend.prepare(batch.metadata)
        forward.forward(batch.metadata, batch.input_ids, batch.positions, caches, batch.logits_indices)
    hooks.synchronize()
    peak = hooks.peak_memory()
    del caches
    hooks.empty_cache()
    return peak or 0
