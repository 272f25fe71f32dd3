"""IpexBackend (``xpu-ipex``): paged attention through IPEX 2.8's op library, on CPU tensors.

IPEX is archived (2.8.0 is the last release, pinned to torch 2.8). This tier exists as a second,
independent implementation of the contract that runs anywhere a torch-2.8 environment can be built,
not as a fast path: on an Intel GPU use the ``xpu`` backend. What it relies on was checked with
IPEX 2.8.0's CPU library (see backends/xpu/README.md and ci/ipex_conformance.sh):

* the cache is head-major (HND) per half: ``[2, blocks, kv_heads, block_size, head_size]``;
* ``reshape_and_cache`` writes every slot it is given, ``-1`` included (out of bounds), so only the
  first ``num_actual_tokens`` rows, with negative slots dropped, ever reach it; that host-side
  slicing is why steps are never captured (``GraphSupport.NEVER``);
* ``flash_attn_varlen_func`` handles decode and prefill rows in one call with the contract's
  bottom-right causal mask, wants the query in the cache dtype, takes the window as
  ``(left, right) = (W - 1, 0)`` and ``softcap = -1`` for "off".
"""

from __future__ import annotations

from typing import Any

import torch

from paged_backend_xpu import environment, ipex_library
from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphSupport,
    PagedError,
    check_attention_inputs,
    check_write_inputs,
)

_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
# The conformance grid sweeps heads 64/80/128/256 and GQA 1/4/8; tests/test_ipex_envelope.py (run by
# ci/ipex_conformance.sh in the IPEX venv) covers the other declared head sizes and ratios.
HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 256})
BLOCK_SIZES = (16, 32, 64)
GQA_RATIOS = frozenset(range(1, 17))
SOFTCAP_OFF = -1.0
"""IPEX's "no soft cap"."""
NO_WINDOW = -1
"""IPEX's "unbounded" for either side of the window."""


class IpexBackend(AttentionBackend):
    """IPEX's CPU paged ops (``torch.ops.torch_ipex``) behind the paged contract; eager only."""

    name = "xpu-ipex"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 20  # below the cpu backend (50): a reference tier, never the automatic choice on a CPU

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        if self.device.type != "cpu":
            raise PagedError(
                f"IpexBackend runs IPEX's CPU kernels on cpu tensors, not on {self.device} "
                f"(on an Intel GPU use the xpu backend)"
            )
        self._ops: Any = ipex_library.ops()  # raises IpexUnavailableError naming the fix

    @classmethod
    def availability(cls) -> Availability:
        """Available on ``cpu`` when IPEX's op library loads into this torch (IPEX 2.8.0 needs torch 2.8)."""
        why = ipex_library.missing_reason()
        if why is not None:
            return Availability(available=False, reason=why, device="cpu")
        note = f"IPEX {ipex_library.ipex_version()} CPU kernels on cpu tensors"
        if environment.no_xpu_reason() is None:
            note += "; an Intel GPU is visible, but this tier runs on the CPU only (the xpu backend uses the GPU)"
        return Availability(available=True, reason=note, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """fp32/bf16/fp16 (any query x cache mix, computed in the cache dtype), heads 32-256 (see HEAD_SIZES),
        blocks 16/32/64, GQA 1-16, sliding window, soft cap; never captured."""
        return BackendCapabilities(
            dtypes=_DTYPES,
            kv_cache_dtypes=_DTYPES,
            block_sizes=BLOCK_SIZES,
            head_sizes=HEAD_SIZES,
            gqa_ratios=GQA_RATIOS,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.NEVER,
        )

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``[2, num_blocks, num_kv_heads, block_size, head_size]``: IPEX's CPU kernels index heads before tokens."""
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store the step's real tokens at their slots; padding (and any slot ``-1``) never reaches IPEX."""
        check_cache(kv_cache, metadata.block_size)
        check_write_inputs(key, value, metadata, kv_cache.shape[2], kv_cache.shape[4])
        count = metadata.num_actual_tokens
        slots, key, value = metadata.slot_mapping[:count], key[:count], value[:count]
        if count == 0:
            return
        # IPEX writes wherever a slot points: check the range on the host (eager only, so this is allowed).
        low, high = (int(v) for v in torch.aminmax(slots))
        if low < 0:
            keep = slots >= 0
            slots, key, value = slots[keep], key[keep], value[keep]
            if slots.numel() == 0:
                return
        num_slots = kv_cache.shape[1] * kv_cache.shape[3]
        if high >= num_slots:
            raise PagedError(f"slot_mapping holds slot {high} but the cache has only {num_slots} slots")
        dtype = kv_cache.dtype
        self._ops.reshape_and_cache(
            key.to(dtype).contiguous(),
            value.to(dtype).contiguous(),
            kv_cache[0],
            kv_cache[1],
            slots.to(torch.int32),
            "auto",
            1.0,
            1.0,
        )

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """One ``flash_attn_varlen_func`` call over decode and prefill rows, in the cache dtype."""
        check_cache(kv_cache, metadata.block_size)
        check_attention_inputs(
            self.capabilities(), query, kv_cache.dtype, (kv_cache.shape[2], kv_cache.shape[4]), metadata, spec
        )
        count = metadata.num_actual_tokens
        # IPEX refuses a query whose dtype differs from the cache's; padding rows stay out of the call.
        out = torch.zeros(query.shape, dtype=kv_cache.dtype, device=query.device)
        if count == 0 or metadata.num_reqs == 0:
            return out.to(query.dtype)
        q = query[:count].to(kv_cache.dtype).contiguous()
        seq_lens = metadata.seq_lens[: metadata.num_reqs]
        cu_seqlens_kv = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
        torch.cumsum(seq_lens, 0, out=cu_seqlens_kv[1:])
        left, right = window_sides(spec.sliding_window)
        self._ops.flash_attn_varlen_func(
            out[:count],
            q,
            kv_cache[0],
            kv_cache[1],
            metadata.query_start_loc[: metadata.num_reqs + 1],
            cu_seqlens_kv,
            metadata.max_query_len,
            metadata.max_seq_len,
            float(spec.softmax_scale),
            True,
            metadata.block_table[: metadata.num_reqs],
            None,
            left,
            right,
            "auto",
            1.0,
            1.0,
            softcap_value(spec.logits_soft_cap),
        )
        return out.to(query.dtype)

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs, keys and values, in every layer (torch indexing)."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        if src_to_dst.shape[0] == 0:
            return
        pairs = src_to_dst.to(dtype=torch.int64)
        for layer, cache in enumerate(kv_caches):
            if cache.dim() != 5 or cache.shape[0] != 2:
                raise PagedError(f"layer {layer}: kv_cache must be [2, blocks, kv_heads, block_size, head_size]")
            low, high = (int(v) for v in torch.aminmax(pairs))
            if low < 0 or high >= cache.shape[1]:
                raise PagedError(f"layer {layer}: block ids {low}..{high} out of range for {cache.shape[1]} blocks")
            idx = pairs.to(cache.device)
            # The pairs are independent (no destination is a source), so one gather and one scatter do.
            cache[:, idx[:, 1]] = cache[:, idx[:, 0]]


def window_sides(sliding_window: int | None) -> tuple[int, int]:
    """The contract's window ``W`` (keys seen, the query's own included) as IPEX varlen's ``(left, right)``."""
    if sliding_window is None:
        return NO_WINDOW, NO_WINDOW
    return sliding_window - 1, 0


def softcap_value(logits_soft_cap: float | None) -> float:
    """The contract's soft cap as IPEX's argument (``-1`` = off)."""
    return SOFTCAP_OFF if logits_soft_cap is None else float(logits_soft_cap)


def check_cache(kv_cache: torch.Tensor, block_size: int) -> None:
    """Refuse a cache that is not this backend's contiguous HND layout at this block size."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise PagedError(
            f"kv_cache must be [2, num_blocks, kv_heads, block_size, head_size] (IPEX's head-major "
            f"layout), got {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] != block_size:
        raise PagedError(
            f"kv_cache block size {kv_cache.shape[3]} (dim 3 of the HND layout) != metadata.block_size {block_size}"
        )
    if not kv_cache.is_contiguous():
        raise PagedError("kv_cache must be contiguous")
