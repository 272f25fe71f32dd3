"""What the graph checks share: the case they capture, and a runner over one attention layer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from paged_conformance.grid import Case, base_config, declared_dtypes
from paged_conformance.session import Conformance
from paged_core.api import AttentionBackend, AttentionMetadata, AttentionSpec, GraphCaptureStrategy, GraphSupport
from paged_core.testing import GraphRunner, StaticInput


def graph_case(conformance: Conformance, length: str) -> Case:
    """The decode case graph checks capture; skips as N/A when the backend declares no capture."""
    caps = conformance.caps
    if caps.graph_support == GraphSupport.NEVER:
        pytest.skip("N/A: graph capture not declared (graph_support is never)")
    head, gqa = base_config(caps) or pytest.skip("N/A: no head size or GQA ratio the suite knows is declared")
    return Case(declared_dtypes(caps)[0], head, caps.block_sizes[0], gqa, "decode", length)


def attention_runner(
    backend: AttentionBackend,
    cache: torch.Tensor,
    spec: AttentionSpec,
    case: Case,
    *,
    max_blocks_per_seq: int,
    capture_sizes: Sequence[int],
    strategy: GraphCaptureStrategy | None = None,
    warmup_iters: int = 2,
) -> GraphRunner:
    """A :class:`GraphRunner` whose step is one layer's ``forward`` into ``cache``; nothing captured yet."""

    def step(metadata: AttentionMetadata, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return backend.forward(query, key, value, cache, metadata, spec)

    inputs = [
        StaticInput(name, (heads, spec.head_size), case.dtype)
        for name, heads in (("query", spec.num_heads), ("key", spec.num_kv_heads), ("value", spec.num_kv_heads))
    ]
    return GraphRunner(
        backend,
        step,
        block_size=case.block_size,
        max_blocks_per_seq=max_blocks_per_seq,
        capture_sizes=capture_sizes,
        device=backend.device,
        inputs=inputs,
        strategy=strategy,
        warmup_iters=warmup_iters,
    )
