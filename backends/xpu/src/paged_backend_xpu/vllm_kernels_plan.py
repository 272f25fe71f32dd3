"""One step's arguments for vllm-xpu-kernels' paged attention, from the batch contract, with no host reads.

``vllm_xpu_kernels.flash_attn_varlen_func`` (0.1.16.2, ``vllm_xpu_kernels/flash_attn_interface.py``) reads paged
KV through the contract's own tensors, so there is little to plan:

* ``cu_seqlens_q = query_start_loc`` (int32 ``[rows + 1]``), ``block_table`` (int32 ``[rows, max_blocks]``) and,
  because a block table is given, key lengths as ``seqused_k = seq_lens`` (the wrapper asserts "when enable
  block_table, seqused_k is needed" and refuses ``cu_seqlens_k`` together with ``seqused_k``).
* ``max_seqlen_q``/``max_seqlen_k`` are host bounds (``max_query_len``, ``max_seq_len``; inside a captured
  step the latter is the runner's ``max_model_len``, still an upper bound). ``max_seqlen_q == 1`` selects the
  split-K decode kernel; anything larger runs the chunk-prefill kernel over rows of query length > 1 and the
  decode kernel over the rest, in the same call (``csrc/flash_attn/flash_api.cpp`` ``mha_varlen_fwd``).
* ``causal=True`` is bottom-right aligned, the contract's rule (``chunk_prefill_kernel.hpp``:
  ``full_tile_offset = seq_len_kv - seq_len_qo``); a window of ``W`` keys (the query's own included) is
  ``window_size = [W - 1, 0]`` (key ``j`` is masked iff ``j < i - left``), no window is ``None`` (= ``(-1, -1)``).
* No soft cap: the library accepts ``softcap=`` and drops it (``mha_varlen_fwd`` never forwards it to a kernel).

The query is cut to ``num_actual_tokens`` rows. Eagerly that drops trailing padding tokens, which matters:
the wrapper takes its speculative-decode fast path whenever ``q.shape[0] == rows * max_seqlen_q`` (for
``1 < max_seqlen_q <= 16``) and then assumes every row has ``max_seqlen_q`` tokens, so a padded ragged batch
could pass for a uniform one. Inside a captured step ``num_actual_tokens`` is the padded count: nothing is cut
and every shape comes from the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_core.api import AttentionMetadata, AttentionSpec, PagedError, UnsupportedConfigError


@dataclass(frozen=True)
class VllmKernelsPlan:
    """The arguments of one step's ``flash_attn_varlen_func`` call (tensors on the metadata's device)."""

    num_tokens: int
    """Query rows handed to the library: ``num_actual_tokens`` (eager) or every row (captured)."""
    cu_seqlens_q: torch.Tensor
    seqused_k: torch.Tensor
    block_table: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    window_size: tuple[int, int] | None

    def varlen_kwargs(self) -> dict[str, object]:
        """Keyword arguments of ``flash_attn_varlen_func(q, k_cache, v_cache, **kwargs)`` (``out=`` apart)."""
        return {
            "max_seqlen_q": self.max_seqlen_q,
            "cu_seqlens_q": self.cu_seqlens_q,
            "max_seqlen_k": self.max_seqlen_k,
            "seqused_k": self.seqused_k,
            "softmax_scale": self.softmax_scale,
            "causal": True,
            "window_size": list(self.window_size) if self.window_size is not None else None,
            "block_table": self.block_table,
        }


def window_size(spec: AttentionSpec) -> tuple[int, int] | None:
    """The library's inclusive ``(left, right)`` window: ``(W - 1, 0)``, or ``None`` for no window."""
    return (spec.sliding_window - 1, 0) if spec.sliding_window is not None else None


def plan_vllm_kernels(metadata: AttentionMetadata, spec: AttentionSpec) -> VllmKernelsPlan:
    """Arguments for ``metadata``'s step (shapes and host ints only; nothing is read from a tensor)."""
    rows = int(metadata.seq_lens.shape[0])
    if rows == 0:
        raise PagedError("an empty step has nothing to attend")
    if spec.logits_soft_cap is not None:
        raise UnsupportedConfigError("vllm-xpu-kernels ignores softcap (flash_api.cpp never passes it to a kernel)")
    return VllmKernelsPlan(
        num_tokens=min(metadata.num_actual_tokens, metadata.num_tokens),
        cu_seqlens_q=metadata.query_start_loc,
        seqused_k=metadata.seq_lens,
        block_table=metadata.block_table,
        max_seqlen_q=max(metadata.max_query_len, 1),
        max_seqlen_k=max(metadata.max_seq_len, 1),
        softmax_scale=spec.softmax_scale,
        window_size=window_size(spec),
    )
