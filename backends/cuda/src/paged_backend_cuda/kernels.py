"""The compiled kernels as Python calls: load (or build) the library once, allocate outputs, launch.

Nothing here reads a tensor's values on the host: sizes come from shapes and the metadata's ints, so every
call records into a CUDA graph as it runs eagerly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import cache

import torch

from paged_backend_cuda import build, plan
from paged_core.api import AttentionMetadata, AttentionSpec

_lock = threading.Lock()
_loaded: str | None = None


def load() -> str:
    """Load ``libpaged_cuda.so`` into torch (building it first if this machine has none); returns its path."""
    global _loaded
    if _loaded is not None:  # no lock once loaded: a traced step must not meet a context manager
        return _loaded
    with _lock:
        if _loaded is None:
            path = build.find_library() or build.build()
            torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
            for op in ("write_kv", "copy_blocks", "attention"):
                # Shape-only stand-ins so a traced step (torch.compile) can run the ops on fake tensors: each
                # writes into tensors it was given and returns nothing.
                torch.library.register_fake(f"paged_cuda::{op}")(_returns_nothing)
            _loaded = str(path)
    return _loaded


def _returns_nothing(*args: object) -> None:
    return None


@cache
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (sizes the decode split plan)."""
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def kv_inputs(key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``key`` and ``value`` as the write_kv kernel takes them: one dtype, last dimension contiguous."""
    if value.dtype != key.dtype:
        value = value.to(key.dtype)
    return _last_dim_contiguous(key), _last_dim_contiguous(value)


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, kv_heads, head]`` at their slots (converted to the cache dtype)."""
    load()
    torch.ops.paged_cuda.write_kv(*kv_inputs(key, value), kv_cache, slot_mapping)


def copy_blocks(kv_cache: torch.Tensor, src_to_dst: torch.Tensor) -> None:
    """Copy whole blocks of one layer's cache: int64 ``[N, 2]`` (source, destination) pairs on its device."""
    load()
    torch.ops.paged_cuda.copy_blocks(kv_cache, src_to_dst)


def attention(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec, sms: int
) -> torch.Tensor:
    """Paged attention over ``kv_cache``, decode splits planned for ``sms`` SMs (:func:`sm_count`); a query of
    another dtype than the cache is converted both ways."""
    load()
    return run_attention(torch.ops.paged_cuda.attention, sms, query, kv_cache, metadata, spec)


def run_attention(
    op: Callable[..., object],
    sms: int,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    spec: AttentionSpec,
) -> torch.Tensor:
    """:func:`attention`'s work with ``op`` (``torch.ops.paged_cuda.attention``'s signature) called once per launch
    of the plan for ``sms`` SMs: dtype conversion, plan and buffers, shared with the CPU emulation (``emulated``)."""
    q = _last_dim_contiguous(query if query.dtype == kv_cache.dtype else query.to(kv_cache.dtype))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    group = spec.num_heads // spec.num_kv_heads
    steps = plan.launches(
        metadata.num_decodes,
        metadata.num_prefills,
        metadata.max_query_len,
        metadata.max_seq_len,
        spec.num_kv_heads,
        group,
        sms,
    )
    none = q.new_empty(0, dtype=torch.float32)
    for step in steps:
        if step.num_splits > 1:
            tokens = step.num_rows  # decode rows: one token each, tokens [0, num_decodes)
            partial = q.new_empty((tokens, spec.num_heads, step.num_splits, spec.head_size), dtype=torch.float32)
            maxes = q.new_empty((tokens, spec.num_heads, step.num_splits), dtype=torch.float32)
            sums = torch.empty_like(maxes)
        else:
            tokens, partial, maxes, sums = 0, none, none, none
        op(
            out,
            q,
            kv_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            partial,
            maxes,
            sums,
            step.first_row,
            step.num_rows,
            step.max_query_len,
            step.num_splits,
            step.split_keys,
            step.rows_per_tile,
            float(spec.softmax_scale),
            float(spec.logits_soft_cap or 0.0),
            int(spec.sliding_window or 0),
            tokens,
        )
    return out if out.dtype == query.dtype else out.to(query.dtype)
