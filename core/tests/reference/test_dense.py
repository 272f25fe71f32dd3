"""The dense oracle helper on its own: SDPA agreement, masking rule, input errors."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import AttentionSpec, PagedError
from paged_core.reference import dense_causal_attention, visibility_mask


def test_matches_sdpa_causal_with_gqa() -> None:
    spec = AttentionSpec(num_heads=6, num_kv_heads=3, head_size=16)
    q, k, v = torch.randn(9, 6, 16), torch.randn(9, 3, 16), torch.randn(9, 3, 16)
    pos = torch.arange(9)
    out = dense_causal_attention(q, k, v, spec, pos, pos)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    ).transpose(0, 1)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_visibility_mask_rule() -> None:
    mask = visibility_mask(torch.tensor([3, 5]), torch.arange(7), sliding_window=3)
    assert mask.tolist() == [
        [False, True, True, True, False, False, False],
        [False, False, False, True, True, True, False],
    ]
    assert visibility_mask(torch.tensor([2]), torch.arange(4), None).tolist() == [[True, True, True, False]]


def test_fully_masked_query_gives_zero_not_nan() -> None:
    spec = AttentionSpec(num_heads=1, num_kv_heads=1, head_size=4)
    out = dense_causal_attention(
        torch.randn(1, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4), spec, torch.tensor([0]), torch.tensor([1, 2])
    )
    assert torch.equal(out, torch.zeros(1, 1, 4))


def test_keeps_query_dtype() -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=4)
    q = torch.randn(3, 2, 4, dtype=torch.bfloat16)
    k = torch.randn(3, 1, 4, dtype=torch.bfloat16)
    assert dense_causal_attention(q, k, k, spec, torch.arange(3), torch.arange(3)).dtype == torch.bfloat16


def test_rejects_mismatched_shapes() -> None:
    spec = AttentionSpec(num_heads=2, num_kv_heads=1, head_size=4)
    pos = torch.arange(3)
    with pytest.raises(PagedError, match="q has shape"):
        dense_causal_attention(torch.randn(3, 1, 4), torch.randn(3, 1, 4), torch.randn(3, 1, 4), spec, pos, pos)
    with pytest.raises(PagedError, match="must both be"):
        dense_causal_attention(torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.randn(3, 2, 4), spec, pos, pos)
    with pytest.raises(PagedError, match="one position per token"):
        dense_causal_attention(torch.randn(3, 2, 4), torch.randn(3, 1, 4), torch.randn(3, 1, 4), spec, pos[:2], pos)
