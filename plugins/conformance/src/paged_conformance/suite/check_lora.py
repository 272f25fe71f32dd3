"""Multi-LoRA: ``FusedOps.lora_shrink`` and ``lora_expand`` against the reference's.

At every declared dtype (the first two under ``quick``), contiguous and ``-strided``, for each adapter shape
(ranks 8 and 16, ranks zero-padded, merged q/k/v and gate/up projections with block-diagonal ``B``;
:data:`paged_conformance.lora.LORA_SHAPES`) and slot mix (one decode token, one without an adapter, all one
slot, every slot mixed, unsorted runs, all -1, long prefill runs; :data:`paged_conformance.lora.SLOT_MIXES`):

- ``lora_shrink`` returns a new fp32 ``[T, R]`` within fp32 tolerance of the reference (the products of any
  dtype are summed in fp32), exactly zero on rows without an adapter, every input untouched;
- ``lora_expand`` on the reference's shrunk rows updates ``y`` in place and returns it: within the dtype's
  tolerance, rows without an adapter bit-identical, nothing outside a view of ``y`` written, the other inputs
  untouched.

``lora:trace`` compiles each op the backend overrides with ``torch.compile(fullgraph=True, backend="aot_eager")``
on strided inputs, after an eager call under the host-read recorder, and compares the two. The reference groups
tokens on the host (eager only), so a backend keeping both of its ops is N/A there.
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.fused import REFERENCE, Untouched, _bits, assert_close, generator
from paged_conformance.grid import FusedCase
from paged_conformance.lora import LORA_SHAPES, SLOT_MIXES, LoraInputs, lora_inputs, outside_view_bits
from paged_conformance.session import Conformance
from paged_conformance.tracing import HostReads, first_line, own_entry
from paged_core.api import FusedOps


def _copies(inp: LoraInputs) -> LoraInputs:
    return LoraInputs(*(t.detach().clone(memory_format=torch.contiguous_format) for t in vars(inp).values()))


def _check_shrink(ops: FusedOps, inp: LoraInputs, what: str) -> torch.Tensor:
    ref = _copies(inp)
    want = REFERENCE.lora_shrink(ref.x, ref.a, ref.slots)
    guard = Untouched({"x": inp.x, "a": inp.a, "slots": inp.slots})
    got = ops.lora_shrink(inp.x, inp.a, inp.slots)
    guard.check(what)
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what} returned {type(got).__name__}, not a tensor")
    guard.assert_not_aliased([got], what)
    if tuple(got.shape) != tuple(want.shape) or got.dtype != torch.float32 or got.device != inp.x.device:
        raise AssertionError(
            f"{what}: {tuple(got.shape)} {got.dtype} on {got.device}, expected {tuple(want.shape)} torch.float32 on "
            f"{inp.x.device}"
        )
    assert_close(got, want, torch.float32, what)
    none = (ref.slots < 0).cpu()
    if none.any() and bool(got.detach().cpu()[none].ne(0).any()):
        raise AssertionError(f"{what}: rows without an adapter (slot -1) are not zero")
    return want


def _check_expand(ops: FusedOps, inp: LoraInputs, shrunk: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    ref = _copies(inp)
    want = REFERENCE.lora_expand(ref.y, shrunk.clone(), ref.b, ref.slots)
    before, outside = inp.y.detach().clone(), outside_view_bits(inp.y)
    guard = Untouched({"shrunk": shrunk, "b": inp.b, "slots": inp.slots})
    got = ops.lora_expand(inp.y, shrunk, inp.b, inp.slots)
    guard.check(what)
    if not isinstance(got, torch.Tensor) or got.data_ptr() != inp.y.data_ptr() or got.shape != inp.y.shape:
        raise AssertionError(f"{what} must update y in place and return it")
    if inp.y.dtype != dtype:
        raise AssertionError(f"{what}: y changed dtype to {inp.y.dtype}")
    assert_close(inp.y, want, dtype, what)
    none = (ref.slots < 0).cpu()
    if none.any() and not torch.equal(_bits(inp.y.detach().cpu()[none]), _bits(before.cpu()[none])):
        raise AssertionError(f"{what}: changed rows without an adapter (slot -1)")
    if outside is not None and not torch.equal(_bits(outside_view_bits(inp.y)), _bits(outside)):  # type: ignore[arg-type]
        raise AssertionError(f"{what}: wrote outside the view of y")


@pytest.mark.paged_capability("lora:shrink_expand")
@pytest.mark.paged_cases("fused")
def test_lora_shrink_expand(conformance: Conformance, fused: FusedCase) -> None:
    """Both products for every adapter shape and slot mix, against the reference."""
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    for shape in LORA_SHAPES:
        for mix, slots in SLOT_MIXES.items():
            inp = lora_inputs(gen, shape, slots, fused.dtype, conformance.device, fused.layout == "strided")
            label = f"[T={len(slots)} {mix}, K={shape.in_features}, R={shape.rank} ({shape.name}), {fused.id}]"
            shrunk = _check_shrink(ops, inp, f"lora_shrink{label}")
            _check_expand(ops, inp, shrunk.to(conformance.device), fused.dtype, f"lora_expand{label}")


@pytest.mark.paged_capability("lora:trace")
@pytest.mark.paged_cases("fused_trace")
@pytest.mark.parametrize("op", ["lora_shrink", "lora_expand"])
def test_lora_traces(conformance: Conformance, fused: FusedCase, op: str) -> None:
    """An overridden op compiles as one graph on strided inputs, reads nothing on the host, and agrees with eager."""
    ops = conformance.fused_ops()
    if getattr(type(ops), op) is getattr(FusedOps, op):
        pytest.skip(f"N/A: {op} is the reference's (grouped on the host: eager only)")
    shape = LORA_SHAPES[3]
    inp = lora_inputs(generator(fused.seed), shape, SLOT_MIXES["unsorted"], fused.dtype, conformance.device, True)
    shrunk = REFERENCE.lora_shrink(inp.x.contiguous(), inp.a.contiguous(), inp.slots.contiguous())

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if op == "lora_shrink":
            return ops.lora_shrink(x, inp.a, inp.slots)
        return ops.lora_expand(y, shrunk, inp.b, inp.slots)

    with HostReads() as reads:
        eager = fn(inp.x, inp.y.clone())  # expand writes y: each call gets its own copy
    if reads.seen:
        raise AssertionError(f"{op} reads tensors on the host ({', '.join(dict.fromkeys(reads.seen))})")
    try:
        compiled = torch.compile(own_entry(fn), backend="aot_eager", fullgraph=True, dynamic=False)(
            inp.x, inp.y.clone()
        )
    except Exception as exc:
        raise AssertionError(
            f"{op} does not trace as one graph (torch.compile fullgraph=True, aot_eager): {first_line(exc)}. An "
            "override must be a torch custom op with a fake (meta) implementation and read nothing on the host."
        ) from None
    assert_close(compiled, eager, fused.dtype if op == "lora_expand" else torch.float32, f"compiled {op} vs eager")
