"""head_rotation and FusedOps.rotate_heads: the block-diagonal normalised Hadamard matrix and the product by it."""

from __future__ import annotations

import math

import pytest
import torch

from paged_core.api import FusedOps, head_rotation
from paged_core.contract.fused_ops import rotation_block

SIZES = (1, 3, 6, 8, 64, 80, 96, 128, 256)


def sylvester_entry(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``H[i, j] = (-1) ** popcount(i & j)`` (natural order), from the definition rather than the recursion."""
    bits = i & j
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return 1 - 2 * parity


@pytest.mark.parametrize(("d", "b"), [(1, 1), (3, 1), (6, 2), (64, 64), (80, 16), (96, 32), (128, 128), (136, 8)])
def test_the_block_is_the_largest_power_of_two_dividing_the_head_size(d: int, b: int) -> None:
    assert rotation_block(d) == b
    with pytest.raises(ValueError, match="head_size must be positive"):
        rotation_block(0)


@pytest.mark.parametrize("d", SIZES)
def test_head_rotation_is_block_diagonal_sylvester_hadamard_symmetric_and_orthogonal(d: int) -> None:
    r = head_rotation(d)
    assert r.shape == (d, d) and r.dtype == torch.float32
    b = rotation_block(d)
    i = torch.arange(d)
    same_block = (i[:, None] // b) == (i[None, :] // b)
    signs = sylvester_entry(i[:, None] % b, i[None, :] % b).double()
    want = torch.where(same_block, signs / math.sqrt(b), torch.zeros((), dtype=torch.float64))
    assert torch.equal(r, want.float())  # each entry +-1/sqrt(b) rounded once, zero off the blocks
    assert torch.equal(r, r.T)
    torch.testing.assert_close(r.double() @ r.double(), torch.eye(d, dtype=torch.float64), atol=1e-6, rtol=0)


def test_head_rotation_is_a_new_tensor_on_the_device_asked_for() -> None:
    a, b = head_rotation(64), head_rotation(64, "cpu")
    assert a.data_ptr() != b.data_ptr() and b.device.type == "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotate_heads_is_the_float32_product_rounded_once_on_any_strides(dtype: torch.dtype) -> None:
    ops, gen = FusedOps(), torch.Generator().manual_seed(0)
    for d in (64, 80, 96):
        buffer = torch.randn(5, 3 * 9 * d + 7, generator=gen).to(dtype)
        x = buffer[:, 4 : 4 + 9 * d].view(5, 9, d)  # a slice of a merged QKV output
        for view in (x, x.transpose(0, 1).contiguous().transpose(0, 1)):
            out = ops.rotate_heads(view)
            assert out.shape == (5, 9, d) and out.dtype == dtype and out.is_contiguous()
            assert out.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
            want = (view.double() @ head_rotation(d).double()).to(dtype)
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 1e-2)
        again = ops.rotate_heads(ops.rotate_heads(x.float()))
        torch.testing.assert_close(again, x.float(), atol=1e-5, rtol=1e-5)  # R is its own inverse


def test_rotate_heads_keeps_dot_products() -> None:
    ops, gen = FusedOps(), torch.Generator().manual_seed(1)
    q, k = torch.randn(4, 2, 80, generator=gen), torch.randn(4, 2, 80, generator=gen)
    torch.testing.assert_close((ops.rotate_heads(q) * ops.rotate_heads(k)).sum(-1), (q * k).sum(-1))


def test_rotate_heads_traces_as_one_graph() -> None:
    ops = FusedOps()

    def step(x: torch.Tensor) -> torch.Tensor:
        return ops.rotate_heads(x[:, :3]) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
    x = torch.randn(6, 5, 48)
    assert torch.equal(compiled(x), step(x))
