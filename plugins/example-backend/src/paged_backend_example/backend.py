"""ExampleBackend: the vendor template, built only on :mod:`paged_core.api`."""

from __future__ import annotations

import torch

from paged_backend_example import kernels
from paged_backend_example.recording import GraphCalls, RecordingCompiledStrategy
from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphCaptureStrategy,
    GraphSupport,
    PagedError,
)


class ExampleBackend(AttentionBackend):
    """Vectorized pure-torch paged attention on the CPU.

    Declares fp32 and bf16, the usual head sizes, block sizes 16 and 32, any
    GQA ratio, no sliding window or soft cap, and capture of uniform decode
    batches. Everything declared is exactly what ``paged-conformance`` tests.

    The engine captures uniform decode batches with :meth:`graph_strategy`
    (``--graph-mode compiled`` or ``device``); :attr:`graph_calls` counts
    what it captured and replayed.
    """

    name = "example"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 10
    compile_backend = "inductor"
    """The ``torch.compile`` backend of :meth:`graph_strategy` (``"aot_eager"`` traces without generating code)."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self.graph_calls = GraphCalls()

    @classmethod
    def availability(cls) -> Availability:
        """Always available: it needs nothing but torch on the CPU."""
        return Availability(available=True, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """The declared envelope (the first block size is the preferred one)."""
        return BackendCapabilities(
            dtypes=frozenset({torch.float32, torch.bfloat16}),
            block_sizes=(16, 32),
            head_sizes=frozenset({64, 80, 128, 256}),
            gqa_ratios=None,
            graph_support=GraphSupport.UNIFORM_DECODE,
        )

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store this step's keys and values at ``metadata.slot_mapping`` (padding slots skipped)."""
        if key.shape != value.shape or key.shape[0] != metadata.slot_mapping.shape[0]:
            raise PagedError(
                f"key {tuple(key.shape)} and value {tuple(value.shape)} need one row per slot "
                f"({metadata.slot_mapping.shape[0]})"
            )
        kernels.write_kv(key, value, kv_cache, metadata.slot_mapping)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Causal attention over the paged cache for every row, decode and prefill alike."""
        if kv_cache.shape[2] != metadata.block_size:
            raise PagedError(f"kv_cache block size {kv_cache.shape[2]} != metadata.block_size {metadata.block_size}")
        return kernels.paged_attention(
            query,
            kv_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            max(metadata.max_query_len, 1),
            spec.softmax_scale,
        )

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs in every layer."""
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        kernels.copy_blocks(kv_caches, src_to_dst.to(torch.int64))

    def graph_strategy(self) -> GraphCaptureStrategy:
        """Decode steps compiled with ``torch.compile``, once per captured size, counted in :attr:`graph_calls`."""
        return RecordingCompiledStrategy(self.graph_calls, backend=self.compile_backend)
