"""One step's arguments for flash-attn 2's paged calls, from the batch contract, with device work only.

flash-attn reads paged KV through the contract's own block table (int32 ``[rows, max_blocks]``, pages
``[blocks, page_size, kv_heads, head_dim]`` = the two halves of paged's cache), so there is little to plan
(flash-attn 2.8.3 ``flash_attn/flash_attn_interface.py``, ``csrc/flash_attn/flash_api.cpp``):

* ``flash_attn_with_kvcache`` (pure-decode steps): ``q`` as ``[rows, 1, heads, head_dim]``,
  ``cache_seqlens = seq_lens``, ``block_table``.
* ``flash_attn_varlen_func(..., block_table=)`` (any other step, decode and prefill rows in one call):
  ``cu_seqlens_q = query_start_loc``; the public function has no ``seqused_k``, so key lengths come as
  ``cu_seqlens_k = [0, cumsum(seq_lens)]`` (``mha_varlen_fwd`` takes ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` as
  row ``b``'s key count; with a block table it is not used as an offset: ``block_info.h`` ``BlockInfo``);
  ``max_seqlen_q``/``max_seqlen_k`` are host bounds (``max_query_len``, ``max_seq_len``; a graph's frozen
  ``max_seq_len`` is the runner's ``max_model_len``, still an upper bound, which is all the kernel needs).
* Window ``W`` (keys including the query's own) is ``window_size = (W - 1, 0)``, none is ``(-1, -1)``; soft cap
  ``0.0`` is off; ``causal=True`` (bottom-right aligned, the contract's rule).

Nothing here reads a tensor on the host, so the plan can be built inside a captured step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_core.api import AttentionMetadata, AttentionSpec, PagedError


@dataclass(frozen=True)
class FlashAttnPlan:
    """The arguments of one step's flash-attn call (all tensors on the metadata's device)."""

    decode_only: bool
    """Every row is a decode row: use ``flash_attn_with_kvcache``; else ``flash_attn_varlen_func``."""
    num_rows: int
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor | None
    """``[0, cumsum(seq_lens)]``, int32 ``[rows + 1]``; ``None`` for decode-only steps, which do not need it."""
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    window_size: tuple[int, int]
    softcap: float

    def kvcache_kwargs(self) -> dict[str, object]:
        """Keyword arguments of ``flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)``."""
        return {
            "cache_seqlens": self.cache_seqlens,
            "block_table": self.block_table,
            "softmax_scale": self.softmax_scale,
            "causal": True,
            "window_size": self.window_size,
            "softcap": self.softcap,
        }

    def varlen_kwargs(self) -> dict[str, object]:
        """Keyword arguments of ``flash_attn_varlen_func(q, k_cache, v_cache, **kwargs)``."""
        if self.cu_seqlens_k is None:
            raise PagedError("this plan is for flash_attn_with_kvcache (a decode-only step) and has no cu_seqlens_k")
        return {
            "cu_seqlens_q": self.cu_seqlens_q,
            "cu_seqlens_k": self.cu_seqlens_k,
            "max_seqlen_q": self.max_seqlen_q,
            "max_seqlen_k": self.max_seqlen_k,
            "softmax_scale": self.softmax_scale,
            "causal": True,
            "window_size": self.window_size,
            "softcap": self.softcap,
            "block_table": self.block_table,
        }


def window_size(spec: AttentionSpec) -> tuple[int, int]:
    """flash-attn's inclusive ``(left, right)`` window: ``(W - 1, 0)``, or ``(-1, -1)`` for none."""
    return (spec.sliding_window - 1, 0) if spec.sliding_window is not None else (-1, -1)


def plan_flash_attn(metadata: AttentionMetadata, spec: AttentionSpec, *, force_varlen: bool = False) -> FlashAttnPlan:
    """Arguments for ``metadata``'s step; ``force_varlen`` plans the varlen form even for a decode-only step."""
    rows = int(metadata.seq_lens.shape[0])
    if rows == 0:
        raise PagedError("an empty step has nothing to attend")
    decode_only = metadata.num_prefills == 0 and metadata.num_decodes == rows and not force_varlen
    cu_seqlens_k = None
    if not decode_only:
        cu_seqlens_k = torch.zeros(rows + 1, dtype=torch.int32, device=metadata.seq_lens.device)
        cu_seqlens_k[1:] = torch.cumsum(metadata.seq_lens, 0, dtype=torch.int32)
    return FlashAttnPlan(
        decode_only=decode_only,
        num_rows=rows,
        cu_seqlens_q=metadata.query_start_loc,
        cu_seqlens_k=cu_seqlens_k,
        cache_seqlens=metadata.seq_lens,
        block_table=metadata.block_table,
        max_seqlen_q=max(metadata.max_query_len, 1),
        max_seqlen_k=max(metadata.max_seq_len, 1),
        softmax_scale=spec.softmax_scale,
        window_size=window_size(spec),
        softcap=spec.logits_soft_cap if spec.logits_soft_cap is not None else 0.0,
    )
