"""CpuFusedOps.lora_shrink / lora_expand against the contract's reference: each grouping path (GEMM on runs of
tokens, gathered GEMM, row kernels of each variant), dtype, slot mix, strided views, tracing, and bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from paged_backend_cpu import CpuFusedOps, ops
from paged_core.api import FusedOps

REF = FusedOps()
CPU = CpuFusedOps()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
VARIANTS = [v for v in ("avx2", "scalar") if v == "scalar" or v in ops.supported_isas()]

SLOT_MIXES: dict[str, Callable[[int], torch.Tensor]] = {
    # every token of one adapter: one run (a GEMM from 8 tokens)
    "one_slot": lambda t: torch.full((t,), 2, dtype=torch.int64),
    # decode rows of different adapters, some without: runs of 1, gathered per slot from 8 tokens
    "scattered": lambda t: torch.arange(t, dtype=torch.int64) % 5 - 1,
    # prefill chunks: long runs next to short ones
    "runs": lambda t: torch.tensor(([1] * 9 + [-1] * 3 + [0] * 2 + [3] * 11) * (t // 25 + 1), dtype=torch.int64)[:t],
    "none": lambda t: torch.full((t,), -1, dtype=torch.int64),
}


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest, use_isa: Callable[[str], str]) -> str:
    name: str = request.param
    use_isa(name)
    return name


def rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def column_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a column slice of a NaN-padded buffer (row stride wider than the row)."""
    wide = torch.full((t.shape[0], t.shape[1] + 7), float("nan"), dtype=t.dtype)
    view = wide[:, 3 : 3 + t.shape[1]]
    view.copy_(t)
    return view


def weights(dtype: torch.dtype, slots: int = 4, rank: int = 21, k: int = 70, n: int = 45) -> tuple[torch.Tensor, ...]:
    a = rand(slots, rank, k, dtype=dtype, seed=1, scale=k**-0.5)
    b = rand(slots, n, rank, dtype=dtype, seed=2, scale=rank**-0.5)
    return a, b


def check(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """Shrink, then expand on the reference's shrunk rows, against the reference; inputs untouched."""
    x_before, a_before, b_before = x.clone(), a.clone(), b.clone()
    want = REF.lora_shrink(x.contiguous(), a, slots)
    got = CPU.lora_shrink(x, a, slots)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[slots < 0], torch.zeros_like(got[slots < 0]))
    want_y = REF.lora_expand(y.contiguous().clone(), want, b, slots)
    ret = CPU.lora_expand(y, want, b, slots)
    assert ret is y
    tol = TOL[y.dtype]
    torch.testing.assert_close(y, want_y, rtol=tol, atol=tol)
    assert torch.equal(x, x_before)
    assert torch.equal(a, a_before) and torch.equal(b, b_before)


@pytest.mark.parametrize("mix", list(SLOT_MIXES))
@pytest.mark.parametrize("tokens", [1, 5, 40])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(variant: str, dtype: torch.dtype, tokens: int, mix: str) -> None:
    a, b = weights(dtype)
    slots = SLOT_MIXES[mix](tokens)
    x = rand(tokens, 70, dtype=dtype, seed=3)
    y = rand(tokens, 45, dtype=dtype, seed=4)
    check(x, y, a, b, slots)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_and_mixed_dtypes(dtype: torch.dtype) -> None:
    """x and y as column slices (NaN outside them must stay NaN and never be read), y transposed storage, and
    fp32 activations with adapters in a 16-bit dtype."""
    a, b = weights(dtype)
    slots = SLOT_MIXES["runs"](33)
    x, y = column_view(rand(33, 70, dtype=dtype, seed=5)), column_view(rand(33, 45, dtype=dtype, seed=6))
    check(x, y, a, b, slots)
    assert y._base is not None and torch.isnan(y._base[:, :3]).all() and torch.isnan(y._base[:, 48:]).all()
    y_t = rand(45, 33, dtype=dtype, seed=7).t()  # column-major y: the op writes through a copy
    check(rand(33, 70, dtype=dtype, seed=8), y_t, a, b, slots)
    a32, b32 = weights(torch.float32)
    check(rand(33, 70, dtype=dtype, seed=9), rand(33, 45, dtype=dtype, seed=10), a32.to(dtype), b32, slots)


def test_merged_projection_block_diagonal() -> None:
    """q/k/v parts of ranks 8, 16 and 8 stacked along R, B block-diagonal: each part's rows read only its ranks."""
    ranks, outs, k = (8, 16, 8), (32, 16, 16), 64
    a = rand(3, sum(ranks), k, dtype=torch.float32, seed=11, scale=0.1)
    b = torch.zeros(3, sum(outs), sum(ranks))
    r0 = n0 = 0
    for i, (r, n) in enumerate(zip(ranks, outs, strict=True)):
        b[:, n0 : n0 + n, r0 : r0 + r] = rand(3, n, r, dtype=torch.float32, seed=20 + i, scale=0.2)
        r0, n0 = r0 + r, n0 + n
    slots = torch.tensor([0, 0, 2, -1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 0], dtype=torch.int64)
    check(rand(14, k, dtype=torch.float32, seed=12), rand(14, sum(outs), dtype=torch.float32, seed=13), a, b, slots)


def test_large_runs_use_the_gemm_path() -> None:
    """A prefill of 300 tokens in a few runs and 300 scattered tokens (gathered per slot), SmolLM2's sizes."""
    a = rand(4, 48, 576, dtype=torch.bfloat16, seed=14, scale=0.04)
    b = rand(4, 1536, 48, dtype=torch.bfloat16, seed=15, scale=0.15)
    for slots in (SLOT_MIXES["runs"](300), torch.randint(-1, 4, (300,), generator=torch.Generator().manual_seed(1))):
        check(
            rand(300, 576, dtype=torch.bfloat16, seed=16), rand(300, 1536, dtype=torch.bfloat16, seed=17), a, b, slots
        )


def test_traces_as_custom_ops() -> None:
    """Both ops compile as one graph (fake implementations; nothing read on the host) and agree with eager."""
    a, b = weights(torch.float32)
    slots = SLOT_MIXES["scattered"](9)
    x, y = rand(9, 70, dtype=torch.float32, seed=18), rand(9, 45, dtype=torch.float32, seed=19)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return CPU.lora_expand(y, CPU.lora_shrink(x, a, slots), b, slots)

    eager = step(x, y.clone())
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)(x, y.clone())
    torch.testing.assert_close(compiled, eager)


def test_bad_input_is_refused() -> None:
    a, b = weights(torch.float32)
    x, y = rand(3, 70, dtype=torch.float32, seed=0), rand(3, 45, dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="slot 4 but only 4 slots"):
        CPU.lora_shrink(x, a, torch.tensor([0, 4, 1]))
    with pytest.raises(RuntimeError, match="3 tokens but 2 slots"):
        CPU.lora_shrink(x, a, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="a must be"):
        CPU.lora_shrink(x, a[:, :, :60], torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="shrunk must be"):
        CPU.lora_expand(y, torch.zeros(3, 7), b, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="slot 9"):
        CPU.lora_expand(y, torch.zeros(3, 21), b, torch.tensor([0, 9, 2]))
