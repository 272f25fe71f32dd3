"""The C++ operators (``torch.ops.paged_cpu``), their fake implementations, and the ISA switch.

Importing this module loads the extension; if it cannot be loaded, :data:`LOAD_ERROR`
says why and the backend reports itself unavailable instead of failing at import.
"""

from __future__ import annotations

import importlib

import torch

LOAD_ERROR: str | None = None
try:
    importlib.import_module("paged_backend_cpu._C")  # runs the C++ registrations of torch.ops.paged_cpu
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    LOAD_ERROR = f"the C++ extension paged_backend_cpu._C failed to load: {exc}"


def _attention_fake(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    split_tokens: int = 0,
) -> torch.Tensor:
    """Shape and dtype of ``attention``'s result, for tracing: a new contiguous tensor like ``query``."""
    return query.new_empty(query.shape)


def _no_result(*args: object) -> None:
    """``write_kv`` and ``copy_blocks`` only mutate their cache arguments."""


if LOAD_ERROR is None:
    torch.library.register_fake("paged_cpu::attention", _attention_fake)
    torch.library.register_fake("paged_cpu::write_kv", _no_result)
    torch.library.register_fake("paged_cpu::copy_blocks", _no_result)


def attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    split_tokens: int = 0,
) -> torch.Tensor:
    """Causal paged attention of ``query`` ``[T, H, D]`` for every row; returns a new ``[T, H, D]`` in its dtype.

    ``split_tokens`` > 0 forces the length of key splits (normally chosen from the
    batch and torch's thread count); tests use it to exercise the split reduction.
    """
    out: torch.Tensor = torch.ops.paged_cpu.attention(
        query, kv_cache, query_start_loc, seq_lens, block_table, scale, split_tokens
    )
    return out


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, KVH, D]`` at int64 ``slot_mapping`` (-1 skipped), in the cache's dtype."""
    torch.ops.paged_cpu.write_kv(key, value, kv_cache, slot_mapping)


def copy_blocks(kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """Copy whole blocks, keys and values, for each int64 (source, destination) pair in every cache."""
    torch.ops.paged_cpu.copy_blocks(kv_caches, src_to_dst)


def isa() -> str:
    """The kernel variant in use: ``avx512bf16``, ``avx512``, ``avx2`` or ``scalar``."""
    name: str = torch.ops.paged_cpu.isa()
    return name


def set_isa(name: str) -> str:
    """Use another kernel variant (``auto`` = the best this CPU runs); refuses one the CPU lacks. Returns the new one.

    The environment variable ``PAGED_CPU_ISA`` does the same at load time.
    """
    chosen: str = torch.ops.paged_cpu.set_isa(name)
    return chosen


def supported_isas() -> list[str]:
    """Kernel variants this CPU can run, best first."""
    names: list[str] = torch.ops.paged_cpu.supported_isas()
    return names
