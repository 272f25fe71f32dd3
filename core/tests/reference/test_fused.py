"""ReferenceFusedOps: the base class's arithmetic one row at a time, batch-invariant, traceable as custom ops."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from paged_core.api import LINEAR_FORMATS, FusedOps, head_rotation
from paged_core.contract.fused_ops import LINEAR_KINDS
from paged_core.reference.fused import ReferenceFusedOps, hadamard_butterfly
from paged_core.testing import ReferenceBackend, random_packed, reference_linear

OPS, BASE = ReferenceFusedOps(), FusedOps()
SIZES = (1, 2, 3, 5, 8, 17, 33, 64, 130)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], pool: torch.Tensor) -> None:
    """Every row of ``fn`` over any subset of ``pool`` (in any order) has the bits of that row alone."""
    alone = [fn(pool[i : i + 1]) for i in range(pool.shape[0])]
    for m in SIZES:
        idx = torch.randperm(pool.shape[0], generator=_gen(m))[:m]
        out = fn(pool[idx])
        for j, i in enumerate(idx.tolist()):
            assert torch.equal(out[j : j + 1], alone[i]), f"row {i} at {j} of {m}"


def test_the_reference_backend_declares_batch_invariance() -> None:
    assert isinstance(ReferenceBackend().fused_ops(), ReferenceFusedOps)
    assert ReferenceBackend.capabilities().batch_invariant
    assert OPS.name == "reference" and OPS.linear_formats == frozenset(LINEAR_FORMATS)
    assert OPS.batch_invariant_linear == frozenset(LINEAR_KINDS) and OPS.batch_invariant_layer_ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_ops_are_row_invariant_and_one_row_is_the_base_class_exactly(dtype: torch.dtype) -> None:
    # 130 rows of 77: above torch's parallel grain, where the batched silu splits a row between threads.
    x = (4 * torch.randn(130, 154, generator=_gen(0))).to(dtype)
    r = torch.randn(130, 154, generator=_gen(1)).to(dtype)
    w = torch.randn(154, generator=_gen(2)).to(dtype)
    cache = torch.randn(300, 16, generator=_gen(3))
    pos = torch.randint(0, 300, (130,), generator=_gen(4))
    q, k = torch.randn(130, 4, 16, generator=_gen(5)).to(dtype), torch.randn(130, 2, 16, generator=_gen(6)).to(dtype)
    by_row = torch.arange(130)  # rotary's rows carry their position: index a pool of row numbers

    def rotary(ops: FusedOps, rows: torch.Tensor) -> torch.Tensor:
        qo, ko = ops.rotary(pos[rows], q[rows], k[rows], cache)
        return torch.cat([qo.flatten(1), ko.flatten(1)], dim=1)

    for name, fn in {
        "rms_norm": lambda ops, t: ops.rms_norm(t, w, 1e-6),
        "add_rms_norm": lambda ops, t: torch.cat(ops.add_rms_norm(t, 0.5 * t, w, 1e-6), dim=1),
        "silu_and_mul": lambda ops, t: ops.silu_and_mul(t),
    }.items():
        assert_rows_invariant(lambda t, fn=fn: fn(OPS, t), x)
        assert torch.equal(fn(OPS, x[3:4]), fn(BASE, x[3:4].clone())), name
        torch.testing.assert_close(fn(OPS, x), fn(BASE, x))
    assert_rows_invariant(lambda rows: rotary(OPS, rows.long()), by_row.to(torch.float64))
    torch.testing.assert_close(rotary(OPS, by_row), rotary(BASE, by_row))
    _, summed = OPS.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, BASE.add_rms_norm(x, r, w, 1e-6)[1])  # the sum is exact either way


@pytest.mark.parametrize("kind", LINEAR_KINDS)
def test_linear_is_row_invariant_for_every_kind(kind: str) -> None:
    gen = _gen(7)
    if kind in LINEAR_FORMATS:
        weight = random_packed(LINEAR_FORMATS[kind], 48, 256, gen)
        x = torch.randn(130, 256, generator=gen).bfloat16()
    else:
        weight = (torch.randn(48, 256, generator=gen) / 16).to(getattr(torch, kind))
        x = torch.randn(130, 256, generator=gen).to(weight.dtype)
    packed = OPS.pack_linear(weight, torch.randn(48, generator=gen).to(x.dtype))
    assert_rows_invariant(lambda t: OPS.linear(t, packed), x)
    if kind in LINEAR_FORMATS:  # one row is exactly the oracle's one-row product
        assert torch.equal(OPS.linear(x[5:6], packed), reference_linear(x[5:6], weight, packed.bias))
    want = BASE.linear(x, packed).float()
    torch.testing.assert_close(OPS.linear(x, packed).float(), want, atol=2e-2, rtol=2e-2)


def test_the_ops_trace_as_opaque_calls_whatever_the_token_count() -> None:
    w = torch.randn(64)
    weight = random_packed(LINEAR_FORMATS["q8_0"], 24, 64)
    packed = OPS.pack_linear(weight, None)

    def step(x: torch.Tensor) -> torch.Tensor:
        return OPS.linear(OPS.silu_and_mul(torch.cat([OPS.rms_norm(x, w, 1e-5)] * 2, dim=1)), packed)

    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=True)
    for t in (3, 9, 40):
        x = torch.randn(t, 64, generator=_gen(t))
        assert torch.equal(compiled(x), step(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotate_heads_is_the_butterfly_row_invariant_and_close_to_the_product(dtype: torch.dtype) -> None:
    for d in (64, 80, 96, 6):
        pool = (3 * torch.randn(130, 9, d, generator=_gen(d))).to(dtype)
        assert_rows_invariant(OPS.rotate_heads, pool)
        out = OPS.rotate_heads(pool[:, 2:7])  # a strided view
        assert out.is_contiguous() and out.dtype == dtype and out.shape == (130, 5, d)
        assert torch.equal(out, hadamard_butterfly(pool[:, 2:7].contiguous()))
        want = (pool[:, 2:7].double() @ head_rotation(d).double()).to(dtype)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 1e-2)


def test_the_butterfly_rounds_in_its_documented_order() -> None:
    """Stages h = 1, 2, 4 on one 8-wide block, written out: each output one rounded sum or difference, then the
    scale (a reordering, such as h = 4 first, gives other bits on these values)."""
    x = torch.tensor([1.0, 2.0**-24, -1.0, 3.0, 2.0**24, 0.1, 7.0, -(2.0**24)])

    def stages(order: tuple[int, ...]) -> torch.Tensor:
        v, j = x.clone(), torch.arange(8)
        for h in order:  # float32: (v[j], v[j + h]) -> (v[j] + v[j + h], v[j] - v[j + h])
            low = j % (2 * h) < h
            partner = v[torch.where(low, j + h, j - h)]
            v = torch.where(low, v + partner, partner - v)
        return v * (1.0 / math.sqrt(8))

    assert torch.equal(hadamard_butterfly(x[None])[0], stages((1, 2, 4)))
    assert not torch.equal(stages((4, 2, 1)), stages((1, 2, 4)))  # the values tell the orders apart


def test_rotate_heads_traces_as_an_opaque_call() -> None:
    compiled = torch.compile(lambda x: OPS.rotate_heads(x[:, 1:]), backend="aot_eager", fullgraph=True, dynamic=True)
    for t in (3, 9):
        x = torch.randn(t, 4, 80, generator=_gen(t))
        assert torch.equal(compiled(x), OPS.rotate_heads(x[:, 1:]))
