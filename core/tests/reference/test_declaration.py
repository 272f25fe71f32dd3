"""What the reference backend declares about itself."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import AttentionSpec, GraphSupport, UnsupportedConfigError
from paged_core.reference import ReferenceBackend


def test_identity_and_availability() -> None:
    assert ReferenceBackend.name == "reference"
    assert ReferenceBackend.priority == 0
    avail = ReferenceBackend.availability()
    assert avail.available and avail.device == "cpu"
    assert ReferenceBackend().device == torch.device("cpu")


def test_capabilities_envelope() -> None:
    caps = ReferenceBackend.capabilities()
    assert caps.default_block_size == 16
    assert sorted(caps.block_sizes) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert caps.dtypes == {torch.float32, torch.bfloat16, torch.float16}
    assert caps.effective_kv_cache_dtypes == caps.dtypes | {torch.int8, torch.float8_e4m3fn, torch.float8_e5m2}
    assert caps.head_sizes is None and caps.gqa_ratios is None
    assert caps.sliding_window and caps.logits_soft_cap
    assert caps.graph_support is GraphSupport.NEVER
    caps.check(AttentionSpec(12, 3, 80, sliding_window=5, logits_soft_cap=30.0), torch.bfloat16, 256)
    with pytest.raises(UnsupportedConfigError, match="block_size 3"):
        caps.check(AttentionSpec(2, 1, 8), torch.float32, 3)


def test_default_kv_cache_shape() -> None:
    backend = ReferenceBackend()
    cache = backend.allocate_kv_cache(5, 16, AttentionSpec(4, 2, 8), torch.float16)
    assert cache.shape == (2, 5, 16, 2, 8) and cache.dtype == torch.float16
    assert backend.graph_strategy().name == "eager"
