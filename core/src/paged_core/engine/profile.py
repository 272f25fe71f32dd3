"""The profiling step: peak activation memory of the largest step, measured before sizing the KV cache."""

from __future__ import annotations

import torch

from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.engine.batch import BatchBuilder, RowState
from paged_core.engine.forward import ModelForward


def profile_peak_bytes(
    forward: ModelForward, backend: AttentionBackend, specs: list[AttentionSpec], dtype: torch.dtype, block_size: int,
    num_tokens: int,
) -> int:  # fmt: skip
    """Device memory in use at the peak of one ``num_tokens``-token prefill (GPUs only; 0 elsewhere).

    Runs the model once over a throwaway cache just large enough for that one
    sequence, so the real KV budget can be what is left after weights and
    activations.
    """
    device = backend.device
    if device.type != "cuda":
        return 0
    blocks = -(-num_tokens // block_size) + 1
    caches = [backend.allocate_kv_cache(blocks, block_size, s, dtype) for s in specs]
    row = RowState(token_ids=[0] * num_tokens, block_ids=list(range(1, blocks)), num_computed=0)
    batch = BatchBuilder(num_tokens, 1, blocks, block_size, device).build([("profile", row, num_tokens)])
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        backend.prepare(batch.metadata)
        forward.forward(batch.metadata, batch.input_ids, batch.positions, caches, batch.logits_indices)
    torch.cuda.synchronize(device)
    peak = int(torch.cuda.max_memory_allocated(device))
    del caches
    torch.cuda.empty_cache()
    return peak
