"""ReferenceBackend.write_kv and copy_blocks: exactly the right slots change, nothing else."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import AttentionSpec, PagedError, build_attention_metadata
from paged_core.reference import ReferenceBackend

SPEC = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=8)


def sentinel_cache(num_blocks: int, block_size: int) -> torch.Tensor:
    """A cache pre-filled with a recognisable value so stray writes show up."""
    return torch.full((2, num_blocks, block_size, 2, 8), 7.0)


def test_write_kv_writes_shuffled_slots_and_skips_padding() -> None:
    backend = ReferenceBackend()
    cache = sentinel_cache(num_blocks=8, block_size=4)
    # Row 0 decodes at position 5 of blocks [6, 2]; row 1 prefills 3 tokens into block 5; one padding token.
    md = build_attention_metadata([1, 3], [6, 3], [[6, 2], [5]], block_size=4)
    slots = torch.cat([md.slot_mapping, torch.tensor([-1])])
    md.slot_mapping = slots
    key = torch.randn(5, 2, 8)
    value = torch.randn(5, 2, 8)
    backend.write_kv(key, value, cache, md)
    assert slots[:4].tolist() == [2 * 4 + 1, 5 * 4 + 0, 5 * 4 + 1, 5 * 4 + 2]
    expected = sentinel_cache(8, 4)
    for t, slot in enumerate(slots[:4].tolist()):
        expected[0, slot // 4, slot % 4] = key[t]
        expected[1, slot // 4, slot % 4] = value[t]
    assert torch.equal(cache, expected)  # the padding token's K/V went nowhere


def test_write_kv_all_padding_changes_nothing() -> None:
    backend = ReferenceBackend()
    cache = sentinel_cache(4, 2)
    md = build_attention_metadata([1], [1], [[1]], block_size=2)
    md.slot_mapping = torch.tensor([-1, -1], dtype=torch.int64)
    backend.write_kv(torch.randn(2, 2, 8), torch.randn(2, 2, 8), cache, md)
    assert torch.equal(cache, sentinel_cache(4, 2))


def test_write_kv_casts_to_cache_dtype() -> None:
    backend = ReferenceBackend()
    cache = torch.zeros(2, 2, 2, 2, 8, dtype=torch.bfloat16)
    md = build_attention_metadata([1], [1], [[1]], block_size=2)
    key = torch.randn(1, 2, 8)
    backend.write_kv(key, key, cache, md)
    assert torch.equal(cache[0, 1, 0], key[0].to(torch.bfloat16))


def test_write_kv_rejects_bad_input() -> None:
    backend = ReferenceBackend()
    md = build_attention_metadata([1], [1], [[3]], block_size=2)
    with pytest.raises(PagedError, match="key"):
        backend.write_kv(torch.randn(2, 2, 8), torch.randn(2, 2, 8), sentinel_cache(4, 2), md)
    with pytest.raises(PagedError, match="slot"):
        backend.write_kv(torch.randn(1, 2, 8), torch.randn(1, 2, 8), sentinel_cache(2, 2), md)
    with pytest.raises(PagedError, match="block size"):
        backend.write_kv(torch.randn(1, 2, 8), torch.randn(1, 2, 8), sentinel_cache(4, 4), md)


def test_copy_blocks_copies_keys_and_values_in_every_layer() -> None:
    backend = ReferenceBackend()
    layers = [torch.randn(2, 6, 4, 2, 8) for _ in range(3)]
    before = [c.clone() for c in layers]
    backend.copy_blocks(layers, torch.tensor([[1, 4], [3, 0]], dtype=torch.int64))
    for cache, old in zip(layers, before, strict=True):
        expected = old.clone()
        expected[:, 4] = old[:, 1]
        expected[:, 0] = old[:, 3]
        assert torch.equal(cache, expected)


def test_copy_blocks_empty_and_errors() -> None:
    backend = ReferenceBackend()
    cache = torch.randn(2, 3, 4, 2, 8)
    old = cache.clone()
    backend.copy_blocks([cache], torch.zeros(0, 2, dtype=torch.int64))
    assert torch.equal(cache, old)
    with pytest.raises(PagedError, match=r"\[N, 2\]"):
        backend.copy_blocks([cache], torch.tensor([1, 2]))
    with pytest.raises(PagedError, match="out of range"):
        backend.copy_blocks([cache], torch.tensor([[0, 3]]))


def test_attention_rejects_inconsistent_metadata() -> None:
    backend = ReferenceBackend()
    cache = torch.zeros(2, 4, 2, 2, 8)
    md = build_attention_metadata([1], [3], [[1, 2]], block_size=2)
    with pytest.raises(PagedError, match="spec"):
        backend.attention(torch.randn(1, 4, 8), cache, md, AttentionSpec(num_heads=4, num_kv_heads=4, head_size=8))
    md.block_table = md.block_table[:, :1]
    with pytest.raises(PagedError, match="needs 2 blocks"):
        backend.attention(torch.randn(1, 4, 8), cache, md, SPEC)
