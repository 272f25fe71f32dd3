"""The routed-experts kernels against the contract's reference (``FusedOps().experts`` / ``moe``), in the Triton
interpreter: expert counts and top-k, uneven and empty experts, token counts off the block size, every dtype,
strided views, a family's device tiles, the device plan itself, packed experts falling back to the reference,
each token's bits independent of the other tokens, and the custom op traced as one graph.

Run by ``test_interpreted.py`` in a child process with TRITON_INTERPRET=1 (see ``interp_kernels.py``).
"""

from __future__ import annotations

import pytest
import torch

from paged_core.api import LINEAR_FORMATS, Activation, FusedOps, MoERouting, PackedExperts
from paged_core.testing import random_packed
from paged_triton import moe_launch, ops
from paged_triton.fused import TritonFusedOps

REF = FusedOps()
OPS = TritonFusedOps()
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _experts(g: torch.Generator, e: int, h: int, i: int, dtype: torch.dtype = torch.float32) -> PackedExperts:
    gate_up = torch.randn(e, 2 * i, h, generator=g) * h**-0.5
    down = torch.randn(e, h, i, generator=g) * i**-0.5
    return PackedExperts(gate_up.to(dtype), down.to(dtype))


def _skewed_ids(g: torch.Generator, tokens: int, e: int, k: int) -> torch.Tensor:
    """``[T, k]`` distinct experts per token, drawn with weights 1, 1/2, 1/3...: uneven groups; every third
    expert from expert 2 on is never drawn (empty experts between busy ones)."""
    probs = 1.0 / torch.arange(1, e + 1, dtype=torch.float64)
    probs[2::3] = 0.0
    return torch.multinomial(probs.expand(tokens, e), k, replacement=False, generator=g).to(torch.int32)


def _check(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, ex: PackedExperts, act: Activation = "silu") -> None:
    want = REF.experts(x.contiguous(), w.contiguous(), ids.contiguous(), ex, act)
    got = OPS.experts(x, w, ids, ex, act)
    assert got.dtype == x.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=TOL[x.dtype], atol=TOL[x.dtype])


@pytest.mark.parametrize("tokens", [1, 45])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_experts", "top_k"), [(4, 1), (8, 2), (16, 4)])
def test_matches_reference(num_experts: int, top_k: int, dtype: torch.dtype, tokens: int) -> None:
    g = torch.Generator().manual_seed(num_experts * 100 + tokens)
    ex = _experts(g, num_experts, 40, 24, dtype)
    ids = _skewed_ids(g, tokens, num_experts, top_k)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=num_experts)
    assert counts[2] == 0  # an empty expert between busy ones
    if tokens > 1:  # uneven groups
        assert counts.max() > counts[counts > 0].min()
    w = torch.rand(tokens, top_k, generator=g)
    _check(torch.randn(tokens, 40, generator=g).to(dtype), w, ids, ex)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_tanh(dtype: torch.dtype) -> None:
    """Every activation of the contract (``Activation``: silu, gelu_tanh) runs in the kernel."""
    g = torch.Generator().manual_seed(7)
    ex = _experts(g, 6, 32, 40, dtype)
    x = (torch.randn(33, 32, generator=g) * 2).to(dtype)
    _check(x, torch.rand(33, 2, generator=g), _skewed_ids(g, 33, 6, 2), ex, "gelu_tanh")


def test_strided_views_with_device_tiles(family: str) -> None:
    """x a column slice of a NaN-padded buffer (left untouched), ids and weights transposed views, gate_up and
    down slices of larger stacks (down with no unit stride): with a family's tiles (64-wide blocks), so the
    reductions over H = 90 and I = 80 take two blocks each."""
    g = torch.Generator().manual_seed(11)
    tokens, e, h, i = 37, 5, 90, 80
    xb = torch.full((tokens, h + 9), float("nan"))
    x = xb[:, 4 : 4 + h]
    x.copy_(torch.randn(tokens, h, generator=g))
    before = xb.clone()
    gate_up = (torch.randn(e + 2, 2 * i, h, generator=g) * h**-0.5)[1 : 1 + e]
    down = (torch.randn(e, i, h, generator=g) * i**-0.5).transpose(1, 2)
    ex = PackedExperts(gate_up, down)
    ids = _skewed_ids(g, tokens, e, 3).t().contiguous().t()
    w = torch.rand(3, tokens, generator=g).t()
    assert not (x.is_contiguous() or ids.is_contiguous() or w.is_contiguous() or down.is_contiguous())
    _check(x, w, ids, ex)
    assert torch.equal(xb.isnan(), before.isnan()) and torch.equal(xb.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize(("tokens", "top_k", "num_experts"), [(1, 2, 8), (45, 4, 16), (40, 1, 40)])
def test_plan_covers_each_pair_once(tokens: int, top_k: int, num_experts: int) -> None:
    """Each block holds one expert's pairs (in pair order), every pair appears once, padding is -1, blocks past
    the plan name expert E; the grid bound is reached when every expert holds one pair."""
    g = torch.Generator().manual_seed(tokens)
    ids = _skewed_ids(g, tokens, num_experts, top_k)
    if num_experts == tokens:  # one pair per expert: E blocks, the bound exactly
        ids = torch.randperm(num_experts, generator=g).reshape(tokens, 1)
    rows, block_experts = moe_launch.plan(ids, num_experts)
    bm, flat = moe_launch.BLOCK_M, ids.reshape(-1).long()
    assert block_experts.numel() == moe_launch.max_blocks(flat.numel(), num_experts)
    assert rows.numel() == block_experts.numel() * bm
    used = rows[rows >= 0]
    assert torch.equal(used.sort().values, torch.arange(flat.numel()))
    by_block = rows.view(-1, bm)
    for b, e in enumerate(block_experts.tolist()):
        block = by_block[b]
        if e == num_experts:
            assert (block == -1).all()
            continue
        valid = block[block >= 0]
        assert valid.numel() > 0 and (flat[valid] == e).all() and torch.equal(valid, valid.sort().values)
        assert (block[valid.numel() :] == -1).all()  # padding only after an expert's pairs
    assert block_experts.tolist() == sorted(block_experts.tolist())
    if num_experts == tokens:
        assert (block_experts < num_experts).all()


def test_packed_and_other_dtypes_go_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed (QuantizedWeight) experts and float64 ones never reach the kernel: the reference's bits."""

    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(ops, "moe_experts", refuse)
    g = torch.Generator().manual_seed(3)
    e, h, i, tokens = 4, 64, 32, 9
    gate_up = random_packed(LINEAR_FORMATS["q8_0"], e * 2 * i, h, g, scale=h**-0.5)
    down = random_packed(LINEAR_FORMATS["q4_0"], e * h, i, g, scale=i**-0.5)
    x, w, ids = torch.randn(tokens, h, generator=g), torch.rand(tokens, 2, generator=g), _skewed_ids(g, tokens, e, 2)
    for ex in (PackedExperts(gate_up, down), _experts(g, e, h, i, torch.float64)):
        want = REF.experts(x, w, ids, ex)
        assert torch.equal(OPS.experts(x, w, ids, ex), want)
    assert TritonFusedOps.moe_formats == frozenset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_routes_then_runs_the_kernel(dtype: torch.dtype) -> None:
    """The inherited ``moe`` (route, then ``experts``) matches the reference ``moe``."""
    g = torch.Generator().manual_seed(5)
    ex = _experts(g, 8, 48, 32, dtype)
    routing = MoERouting(8, 2, renormalize=True)
    x, logits = torch.randn(29, 48, generator=g).to(dtype), torch.randn(29, 8, generator=g).to(dtype)
    got = OPS.moe(x, logits, ex, routing)
    torch.testing.assert_close(got, REF.moe(x, logits, ex, routing), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_token_independent_of_the_others(dtype: torch.dtype) -> None:
    """A token's output bits alone equal its bits among 70 others (other experts' groups, other block rows)."""
    g = torch.Generator().manual_seed(13)
    ex = _experts(g, 8, 40, 24, dtype)
    x = torch.randn(71, 40, generator=g).to(dtype)
    w, ids = torch.rand(71, 2, generator=g), _skewed_ids(g, 71, 8, 2)
    batch = OPS.experts(x, w, ids, ex)
    for t in (0, 33, 70):
        alone = OPS.experts(x[t : t + 1], w[t : t + 1], ids[t : t + 1], ex)
        assert torch.equal(alone[0], batch[t]), t
    shuffled = torch.randperm(71, generator=g)
    assert torch.equal(OPS.experts(x[shuffled], w[shuffled], ids[shuffled], ex), batch[shuffled])


def test_no_tokens() -> None:
    ex = _experts(torch.Generator().manual_seed(1), 4, 16, 16)
    out = OPS.experts(torch.zeros(0, 16), torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64), ex)
    assert out.shape == (0, 16)


def test_custom_op_traces_as_one_graph() -> None:
    g = torch.Generator().manual_seed(17)
    ex = _experts(g, 4, 32, 16)
    w, ids = torch.rand(6, 2, generator=g), _skewed_ids(g, 6, 4, 2)

    def step(x: torch.Tensor) -> torch.Tensor:
        return OPS.experts(x, w, ids, ex) * 2

    x = torch.randn(6, 32, generator=g)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)(x)
    torch.testing.assert_close(compiled, step(x))
