"""CudaBackend: this package's own CUDA kernels, any batch in a CUDA graph."""

from __future__ import annotations

import torch

from paged_backend_cuda import build, environment
from paged_backend_cuda.base import CudaBackendBase
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphSupport,
)

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
HEAD_SIZES = frozenset({64, 80, 96, 112, 128, 160, 192, 256})
"""Must match ``kHeadSizes`` in ``csrc/launch.h`` (a test compares them)."""
BLOCK_SIZES = (16, 32, 64)


class CudaBackend(CudaBackendBase):
    """Paged attention in CUDA C++: decode tiles that load each key once per GQA group, split-K for long
    contexts, prefill over cached context, sliding window and soft cap, fp32/bf16/fp16 with fp32 sums.

    The kernels are compiled by nvcc on first use (see :mod:`paged_backend_cuda.build`); every launch takes
    its grid from shapes and host ints, so whole steps of any batch capture in a CUDA graph.
    """

    name = "cuda"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 60
    emulatable = True

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self._kernels.load()
        if self.device.type == "cuda":
            from paged_backend_cuda import kernels

            self._sms = kernels.sm_count(self.device.index if self.device.index is not None else 0)
        else:
            from paged_backend_cuda import emulated

            self._sms = emulated.SM_COUNT

    @classmethod
    def availability(cls) -> Availability:
        """A CUDA torch with an sm_80+ GPU, and the kernels built or an nvcc to build them; or, with
        ``PAGED_CUDA_EMULATE=1``, the CPU emulation of the same kernels."""
        if environment.emulate_requested():
            return Availability(
                True, "CUDA kernels in the CPU emulation (PAGED_CUDA_EMULATE=1; slow, for testing)", "cpu"
            )
        extra = None
        if build.find_library() is None and build.find_nvcc() is None:
            extra = (
                f"the kernels are not built and no nvcc was found: install the CUDA toolkit (or set CUDA_HOME), "
                f"`pip install 'paged-backend-cuda[nvcc]'`, or set {build.LIBRARY_ENV}"
            )
        return environment.detect(extra)

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """fp32/bf16/fp16 (any mix with the cache dtype), head sizes 64-256, blocks 16/32/64, any GQA, window,
        soft cap, ``GraphSupport.ANY``."""
        return BackendCapabilities(
            dtypes=DTYPES,
            kv_cache_dtypes=DTYPES,
            block_sizes=BLOCK_SIZES,
            head_sizes=HEAD_SIZES,
            gqa_ratios=None,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.ANY,
        )

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Decode rows (split-K when the batch is small), then prefill rows, over the paged cache."""
        self.check_attention_inputs(query, kv_cache, metadata, spec)
        out: torch.Tensor = self._kernels.attention(query, kv_cache, metadata, spec, self._sms)
        return out
