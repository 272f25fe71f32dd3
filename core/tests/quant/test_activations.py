"""round_activations_q8: the int8-per-32-block rounding a packed-linear kernel may declare."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_core.quant import round_activations_q8


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 4), blocks=st.integers(1, 4), scale=st.floats(1e-6, 1e4), seed=st.integers(0, 2**16))
def test_each_block_is_int8_times_one_scale_within_half_a_step(rows: int, blocks: int, scale: float, seed: int) -> None:
    x = torch.randn(rows, 32 * blocks, generator=torch.Generator().manual_seed(seed)) * scale
    r = round_activations_q8(x)
    assert r.dtype == torch.float32 and r.shape == x.shape
    xb, rb = x.reshape(rows, blocks, 32), r.reshape(rows, blocks, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    q = rb / d  # q * d rounded once in fp32, divided again: integers up to a few ulps
    assert ((q - q.round()).abs() <= 1e-4).all() and q.round().abs().max() <= 127  # int8 times d
    assert ((rb - xb).abs() <= d / 2 * (1 + 1e-5)).all()  # to the nearest step
    assert torch.allclose(rb.abs().amax(-1), xb.abs().amax(-1), rtol=1e-6, atol=0)  # the largest is kept


def test_the_rule_to_the_bit() -> None:
    """d = max|x| / 127, q = round(x * (1 / d)) with ties to even, in fp32; a zero block stays zero."""
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -63.5] + [0.0] * 26, [0.0] * 32])
    r = round_activations_q8(x)
    assert r[0, :6].tolist() == [127.0, 0.0, 2.0, 2.0, -0.0, -64.0]  # d = 1: ties go to even
    assert torch.equal(r[1], torch.zeros(32))
    half = round_activations_q8(x.to(torch.bfloat16))  # other dtypes are read as fp32
    assert half.dtype == torch.float32 and torch.equal(half, r)


def test_a_width_that_is_no_multiple_of_the_block_is_refused() -> None:
    with pytest.raises(ValueError, match="in_features 40 is not a multiple of the activation block of 32"):
        round_activations_q8(torch.zeros(2, 40))
