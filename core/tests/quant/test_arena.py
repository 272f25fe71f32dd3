"""arena.gather: packed weights moved, bytes unchanged, into one huge-page-aligned buffer in the order given."""

from __future__ import annotations

import torch

from paged_core.quant import INT8, Q4_1, Q8_0, QuantizedWeight, arena, random_packed
from paged_core.quant.weight import cat_rows


def _weights() -> list[QuantizedWeight]:
    gen = torch.Generator().manual_seed(0)
    q = random_packed(Q4_1, 576, 576, gen, name="q")
    k = random_packed(Q4_1, 192, 576, gen, name="k")
    big = random_packed(Q8_0, 30, 64, gen, name="every other row")
    strided = QuantizedWeight(Q8_0, (15, 64), big.data[::2], None, big.name)
    scaled = random_packed(INT8, 7, 40, gen, name="int8")
    return [q, k, strided, scaled]


def test_bytes_shapes_and_names_are_kept_in_one_buffer_in_order() -> None:
    before = _weights()
    after = arena.gather(before)
    assert [w.name for w in after] == [w.name for w in before]
    for a, b in zip(after, before, strict=True):
        assert a.format is b.format and a.shape == b.shape
        assert torch.equal(a.data, b.data) and a.data.is_contiguous()
        assert a.data.data_ptr() != b.data.data_ptr()
        assert a.scale is b.scale  # int8's scales stay where they are
    ptrs = [w.data.data_ptr() for w in after]
    assert ptrs[0] % arena.HUGE_PAGE == 0 and all(p % arena.ALIGN == 0 for p in ptrs)
    assert ptrs == sorted(ptrs)
    assert len({w.data.untyped_storage().data_ptr() for w in after}) == 1  # one buffer


def test_adjacent_weights_merge_as_a_view() -> None:
    q, k = arena.gather(_weights()[:2])
    merged = cat_rows([q.data, k.data])
    assert merged.data_ptr() == q.data.data_ptr() and merged.shape == (768, q.data.shape[1])


def test_weights_off_the_cpu_are_left_as_they_are() -> None:
    meta = QuantizedWeight(Q8_0, (4, 32), torch.empty(4, 34, dtype=torch.uint8, device="meta"), None, "meta")
    cpu = _weights()[0]
    out = arena.gather([meta, cpu])
    assert out[0] is meta and torch.equal(out[1].data, cpu.data)
    assert arena.gather([meta]) == [meta]
