"""The multi-LoRA kernels against the contract's reference (``FusedOps().lora_shrink`` / ``lora_expand``), in the
Triton interpreter: both forms (one program per token up to 16 tokens, sorted token blocks above), every dtype,
slot mixes, a merged projection's block-diagonal B, strided views, and the custom ops traced as one graph.

Run by ``test_interpreted.py`` in a child process with TRITON_INTERPRET=1 (see ``interp_kernels.py``).
"""

from __future__ import annotations

import pytest
import torch

from paged_core.api import FusedOps
from paged_triton import lora_launch
from paged_triton.fused import TritonFusedOps
from paged_triton.tiles import INTERPRET_TILES_ENV

REF = FusedOps()
OPS = TritonFusedOps()
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
MIXES = {
    "one_slot": lambda t, g: torch.full((t,), 1, dtype=torch.int64),
    "mixed": lambda t, g: torch.randint(-1, 3, (t,), generator=g),
    "unsorted_runs": lambda t, g: torch.tensor([2, 2, 2, 0, 0, -1, 1, 1, 2, 0] * (t // 10 + 1))[:t],
    "none": lambda t, g: torch.full((t,), -1, dtype=torch.int64),
}


def _check(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    want = REF.lora_shrink(x.contiguous(), a, slots)
    got = OPS.lora_shrink(x, a, slots)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want_y = REF.lora_expand(y.contiguous().clone(), want, b, slots)
    assert OPS.lora_expand(y, want, b, slots) is y
    torch.testing.assert_close(y, want_y, rtol=TOL[y.dtype], atol=TOL[y.dtype])


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("tokens", [1, 7, 16, 45])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(dtype: torch.dtype, tokens: int, mix: str) -> None:
    g = torch.Generator().manual_seed(tokens)
    a = (torch.randn(3, 24, 70, generator=g) * 0.1).to(dtype)
    b = (torch.randn(3, 45, 24, generator=g) * 0.2).to(dtype)
    x, y = torch.randn(tokens, 70, generator=g).to(dtype), torch.randn(tokens, 45, generator=g).to(dtype)
    _check(x, y, a, b, MIXES[mix](tokens, g))


@pytest.mark.parametrize("tiles", ["interpreter", "cdna"])
@pytest.mark.parametrize("tokens", [5, 40])
def test_merged_projection_and_views(tokens: int, tiles: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of ranks 8, 16, 8, 48 stacked along R (80: two blocks of 64 outputs, and with a device's tiles two
    reduction blocks of expand, as K = 90 is for shrink), B block-diagonal; x and y column slices of NaN-padded
    buffers, whose NaN must stay where it is."""
    if tiles != "interpreter":
        monkeypatch.setenv(INTERPRET_TILES_ENV, tiles)
    g = torch.Generator().manual_seed(3)
    ranks, outs, k = (8, 16, 8, 48), (32, 16, 16, 70), 90
    a = torch.randn(2, sum(ranks), k, generator=g) * 0.1
    b = torch.zeros(2, sum(outs), sum(ranks))
    r0 = n0 = 0
    for r, n in zip(ranks, outs, strict=True):
        b[:, n0 : n0 + n, r0 : r0 + r] = torch.randn(2, n, r, generator=g) * 0.2
        r0, n0 = r0 + r, n0 + n
    xb = torch.full((tokens, k + 9), float("nan"))
    yb = torch.full((tokens, sum(outs) + 9), float("nan"))
    x, y = xb[:, 4 : 4 + k], yb[:, 4 : 4 + sum(outs)]
    x.copy_(torch.randn(tokens, k, generator=g))
    y.copy_(torch.randn(tokens, sum(outs), generator=g))
    _check(x, y, a, b, torch.randint(-1, 2, (tokens,), generator=g))
    assert torch.isnan(yb[:, :4]).all() and torch.isnan(yb[:, 4 + sum(outs) :]).all()


def test_forms_switch_at_the_token_limit() -> None:
    """Both forms run: the per-token kernel up to TOKEN_KERNEL_MAX tokens, the sorted one above (one token apart)."""
    for tokens in (lora_launch.TOKEN_KERNEL_MAX, lora_launch.TOKEN_KERNEL_MAX + 1):
        g = torch.Generator().manual_seed(tokens)
        a, b = torch.randn(4, 16, 32, generator=g), torch.randn(4, 20, 16, generator=g)
        _check(torch.randn(tokens, 32, generator=g), torch.randn(tokens, 20, generator=g), a, b,
               torch.randint(-1, 4, (tokens,), generator=g))  # fmt: skip


def test_custom_ops_trace_as_one_graph() -> None:
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(3, 16, 40, generator=g), torch.randn(3, 24, 16, generator=g)
    slots = torch.tensor([0, -1, 2, 2, 1])
    x, y = torch.randn(5, 40, generator=g), torch.randn(5, 24, generator=g)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return OPS.lora_expand(y, OPS.lora_shrink(x, a, slots), b, slots)

    eager = step(x, y.clone())
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)(x, y.clone())
    torch.testing.assert_close(compiled, eager)
