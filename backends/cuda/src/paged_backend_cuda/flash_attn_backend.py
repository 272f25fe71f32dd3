"""``cuda-flash-attn``: attention through flash-attn 2's paged-KV calls, when ``flash_attn`` is importable.

flash-attn reads the contract's block table directly, so nothing is planned on the host
(:mod:`~paged_backend_cuda.flash_attn_plan`, rebuilt at each call: for varlen steps that is one small cumsum
per layer, and it keeps no buffer a graph could outlive): pure-decode steps call ``flash_attn_with_kvcache``,
any other step one ``flash_attn_varlen_func(..., block_table=)`` over all rows. Its paged kernels need pages that are a
multiple of 256 tokens (``csrc/flash_attn/flash_api.cpp``: "Paged KV cache block size must be divisible by
256"), hence the declared block sizes. Both calls take only device tensors and host ints fixed by the
shapes, so they capture into CUDA graphs; the tier declares ``UNIFORM_DECODE`` (the varlen path over padded
``ANY`` batches is plausible but has not run on a GPU yet).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

import torch

from paged_backend_cuda import environment
from paged_backend_cuda.base import CudaBackendBase
from paged_backend_cuda.flash_attn_plan import plan_flash_attn
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphSupport,
    PagedError,
)

INSTALL_HINT = (
    "flash_attn is not importable: PyPI has only its source package; build it against your CUDA torch with "
    "`pip install flash-attn --no-build-isolation` (hours) or install a prebuilt wheel from the flash-attention "
    "GitHub releases"
)
MIN_VERSION = (2, 6)
"""The first release whose ``flash_attn_varlen_func`` takes ``block_table`` and ``softcap``."""
_DTYPES = frozenset({torch.bfloat16, torch.float16})


def missing_flash_attn() -> str | None:
    """The install hint when ``flash_attn`` cannot be found (without importing it)."""
    return INSTALL_HINT if importlib.util.find_spec("flash_attn") is None else None


class FlashAttnBackend(CudaBackendBase):
    """Paged attention through flash-attn 2 on NVIDIA GPUs (bf16/fp16, pages of 256 or 512 tokens)."""

    name = "cuda-flash-attn"
    api_version = 1
    priority = 55

    @classmethod
    def availability(cls) -> Availability:
        """Available with a CUDA torch, an sm_80+ GPU and ``flash_attn`` installed."""
        return environment.detect(extra=missing_flash_attn())

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """flash-attn 2's forward kernels: bf16/fp16, head sizes that are multiples of 8 up to 256, any GQA group."""
        return BackendCapabilities(
            dtypes=_DTYPES,
            kv_cache_dtypes=_DTYPES,
            block_sizes=(256, 512),
            # flash_api.cpp: head_size % 8 == 0 and <= 256, run by the 64/96/128/192/256 kernels.
            head_sizes=frozenset({64, 80, 96, 128, 160, 192, 256}),
            gqa_ratios=None,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.UNIFORM_DECODE,
        )

    def __init__(self, device: str | torch.device | None = None) -> None:
        missing = missing_flash_attn()
        if missing is not None:
            raise PagedError(f"{type(self).__name__} cannot run here: {missing}")
        super().__init__(device)
        try:
            module = importlib.import_module("flash_attn")
        except Exception as exc:  # a broken build fails in many ways (undefined symbols, another torch, ...)
            raise PagedError(f"{type(self).__name__} cannot run here: importing flash_attn failed: {exc}") from exc
        self._start(module)

    def _start(self, flash_attn: Any) -> None:
        """Bind the two calls of a loaded ``flash_attn`` (apart from ``__init__`` so tests can drive a stand-in)."""
        version = str(getattr(flash_attn, "__version__", "0"))
        if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) < MIN_VERSION:
            raise PagedError(f"{type(self).__name__} needs flash-attn >= 2.6 (paged varlen, soft cap), found {version}")
        self._varlen: Callable[..., torch.Tensor] = flash_attn.flash_attn_varlen_func
        self._kvcache: Callable[..., torch.Tensor] = flash_attn.flash_attn_with_kvcache

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """One flash-attn call over every row; the query is cast to the cache dtype and the output back."""
        self.check_attention_inputs(query, kv_cache, metadata, spec)
        if metadata.seq_lens.shape[0] == 0:
            return torch.empty_like(query)
        plan = plan_flash_attn(metadata, spec)
        q = query.to(kv_cache.dtype)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        if plan.decode_only:
            rows = plan.num_rows
            out = self._kvcache(q[:rows].unsqueeze(1), k_cache, v_cache, **plan.kvcache_kwargs()).squeeze(1)
            if rows != q.shape[0]:  # eager padding tokens after the rows: their outputs may hold anything
                out = torch.cat([out, out.new_zeros(q.shape[0] - rows, *out.shape[1:])])
        else:
            out = self._varlen(q, k_cache, v_cache, **plan.varlen_kwargs())
        return out.to(query.dtype)
