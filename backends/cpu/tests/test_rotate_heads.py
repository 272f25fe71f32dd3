"""rotate_heads: the C++ butterfly against the reference backend's (bit for bit) and the base class's product, on
every kernel variant, dtype, head size and stride; inputs left alone, traced through the fake, bad input refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import CpuFusedOps, ops
from paged_core.api import FusedOps, head_rotation
from paged_core.testing import ReferenceFusedOps

CPU, BUTTERFLY, PRODUCT = CpuFusedOps(), ReferenceFusedOps(), FusedOps()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VARIANTS = [v for v in ("avx2", "scalar") if v == "scalar" or v in ops.supported_isas()]
HEAD_SIZES = [1, 6, 8, 24, 64, 80, 96, 128, 256, 512, 768]
"""Blocks of 1, 2, 8 (vectors of 2 and one vector), 16 and 32 (several per vector), 64 and 128 (in registers),
256 and 512 (beyond the registers), and three blocks of 256."""


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest, use_isa: Callable[[str], str]) -> str:
    name: str = request.param
    use_isa(name)
    assert ops.fused_isa() == name
    return name


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def qkv_slice(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H, D]`` as the key slice of a merged QKV output: NaN before and after, row stride ``3 H D + 5``."""
    t, h, d = x.shape
    buffer = torch.full((t, 3 * h * d + 5), float("nan"), dtype=x.dtype)
    view = buffer[:, h * d : 2 * h * d].view(t, h, d)
    view.copy_(x)
    return view


def head_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` stored heads first, ``[H, T, D]``, seen as ``[T, H, D]`` (token stride ``D``, head stride ``T D``)."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_SIZES)
def test_rotate_heads_has_the_reference_butterflys_bits(variant: str, dtype: torch.dtype, d: int) -> None:
    gen = torch.Generator().manual_seed(d)
    for tokens in (1, 3, 70):
        x = (4 * torch.randn(tokens, 9, d, generator=gen)).to(dtype)
        want = BUTTERFLY.rotate_heads(x)
        for view in (x, qkv_slice(x), head_major(x), x[:, ::2]):
            got = CPU.rotate_heads(view)
            assert got.is_contiguous() and got.dtype == dtype and got.shape == view.shape
            assert torch.equal(_bits(got), _bits(want if view.shape == x.shape else BUTTERFLY.rotate_heads(view)))
        close = (x.double() @ head_rotation(d).double()).to(dtype)
        torch.testing.assert_close(CPU.rotate_heads(x), close, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 1e-2)


def test_rotate_heads_is_its_own_inverse_and_keeps_dot_products(variant: str) -> None:
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(5, 9, 80, generator=gen), torch.randn(5, 9, 80, generator=gen)
    torch.testing.assert_close(CPU.rotate_heads(CPU.rotate_heads(q)), q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((CPU.rotate_heads(q) * CPU.rotate_heads(k)).sum(-1), (q * k).sum(-1))


def test_rotate_heads_leaves_its_input_and_handles_empty_and_special_values() -> None:
    x = qkv_slice(torch.randn(4, 9, 64).bfloat16())
    assert x._base is not None
    before = x._base.clone()
    out = CPU.rotate_heads(x)
    assert torch.equal(_bits(x._base), _bits(before)) and out.data_ptr() != x.data_ptr()
    assert CPU.rotate_heads(torch.randn(0, 9, 64)).shape == (0, 9, 64)
    assert CPU.rotate_heads(torch.randn(3, 0, 64)).shape == (3, 0, 64)
    special = torch.zeros(1, 1, 8)
    special[0, 0, 0], special[0, 0, 5] = float("inf"), float("nan")
    got = CPU.rotate_heads(special)
    assert got.isnan().all()  # inf - inf in some stage, and NaN spread through every sum


def test_rotate_heads_agrees_with_the_base_class_product() -> None:
    x = torch.randn(300, 9, 96, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(CPU.rotate_heads(x), PRODUCT.rotate_heads(x), atol=2e-6, rtol=2e-6)


def test_rotate_heads_traces_through_its_fake() -> None:
    torch._dynamo.reset()

    def step(qkv: torch.Tensor) -> torch.Tensor:
        t = qkv.shape[0]
        return CPU.rotate_heads(qkv[:, 64:192].view(t, 2, 64)).sum(-1)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=True)
    for t in (3, 7):
        qkv = torch.randn(t, 256)
        assert torch.equal(compiled(qkv), step(qkv))
    torch.library.opcheck(torch.ops.paged_cpu.rotate_heads.default, (torch.randn(3, 2, 80).bfloat16(),))


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (
            torch.randn(3, 64),
            r"paged_cpu.rotate_heads: x must be 3-D \[tokens, heads, head_size\], got shape \[3, 64\]",
        ),
        (torch.randn(3, 2, 0), r"rotate_heads: head_size must be positive"),
        (torch.randn(3, 2, 8).double(), r"rotate_heads: x dtype Double not supported"),
    ],
)
def test_bad_input_is_refused(x: torch.Tensor, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        CPU.rotate_heads(x)
