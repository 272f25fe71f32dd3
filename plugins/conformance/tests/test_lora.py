"""The multi-LoRA section: the reference and a correct reimplementation pass; each planted bug fails where it should.

Fakes are in ``lora_fakes``; each nested run selects the section with ``-k lora``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from paged_conformance.fused import REFERENCE
from paged_conformance.lora import LORA_SHAPES, SLOT_MIXES, lora_inputs, lora_weights, outside_view_bits

ROWS = ("lora:shrink_expand", "lora:trace")
Report = dict[str, Any]
Run = Callable[..., tuple[int, Report]]


def _failed(report: Report) -> set[tuple[str, str]]:
    out = set()
    for t in report["tests"]:
        if t["outcome"] in ("failed", "error"):
            name, _, param = t["nodeid"].split("::")[-1].partition("[")
            out.add((name, param.rstrip("]")))
    return out


def _messages(report: Report) -> list[str]:
    return [t["message"] for t in report["tests"] if t["outcome"] in ("failed", "error")]


def _statuses(report: Report) -> dict[str, str]:
    return {row: report["capabilities"][row]["status"] for row in ROWS}


def test_reference_passes_with_trace_not_applicable(run_suite: Run) -> None:
    code, report = run_suite("fused_fakes:FusedFakeBf16", "-k", "lora")
    assert code == 0, _messages(report)
    assert _statuses(report) == {"lora:shrink_expand": "pass", "lora:trace": "n/a"}
    assert report["capabilities"]["lora:shrink_expand"]["counts"]["passed"] == 4  # 2 dtypes x 2 layouts


def test_a_traceable_reimplementation_passes_both_rows(run_suite: Run) -> None:
    code, report = run_suite("lora_fakes:GatheredLora", "-k", "lora")
    assert code == 0, _messages(report)
    assert _statuses(report) == {"lora:shrink_expand": "pass", "lora:trace": "pass"}
    assert report["backend"]["fused_ops"]["overrides"] == ["lora_shrink", "lora_expand"]


BUGS = [
    ("MinusOneIsSlotZero", {"float32", "float32-strided"}, "lora_shrink[T=1 no_adapter"),
    ("ExpandReturnsNew", {"float32", "float32-strided"}, "must update y in place and return it"),
    ("ShrinkInInputDtype", {"bfloat16", "bfloat16-strided"}, "torch.bfloat16 on cpu, expected"),
    ("IgnoresStrides", {"float32-strided"}, "mismatch"),
]


@pytest.mark.parametrize(("fake", "params", "fragment"), BUGS, ids=[b[0] for b in BUGS])
def test_planted_bug_fails_the_values(run_suite: Run, fake: str, params: set[str], fragment: str) -> None:
    code, report = run_suite(f"lora_fakes:{fake}", "-k", "test_lora_shrink_expand")
    assert code != 0
    assert _failed(report) == {("test_lora_shrink_expand", p) for p in params}, _failed(report)
    assert all(fragment in m for m in _messages(report)), _messages(report)
    assert report["capabilities"]["lora:shrink_expand"]["status"] == "fail"


def test_host_reads_fail_the_trace_only(run_suite: Run) -> None:
    code, report = run_suite("lora_fakes:HostGrouped", "-k", "lora")
    assert code != 0
    assert _failed(report) == {("test_lora_traces", f"float32-strided-{op}") for op in ("lora_shrink", "lora_expand")}
    assert all("reads tensors on the host" in m for m in _messages(report)), _messages(report)
    assert _statuses(report) == {"lora:shrink_expand": "pass", "lora:trace": "fail"}


# --- the building blocks -----------------------------------------------------------------------------------------


def test_merged_weights_are_block_diagonal_and_rank_padded() -> None:
    shape = LORA_SHAPES[3]  # q/k/v parts, slots of ranks 8, 16, 8, 4 in blocks of 16
    a, b = lora_weights(torch.Generator().manual_seed(0), shape)
    assert a.shape == (4, 48, 576) and b.shape == (4, 960, 48)
    assert a[3, 4:16].eq(0).all() and a[3, :4].ne(0).all() and b[3, :, 4:16].eq(0).all()
    assert b[1, :576, 16:].eq(0).all() and b[1, 576:768, :16].eq(0).all() and b[1, 576:768, 32:].eq(0).all()
    assert b[1, 576:768, 16:32].ne(0).all()


def test_strided_inputs_hold_the_values_around_nan() -> None:
    gen = torch.Generator().manual_seed(1)
    inp = lora_inputs(gen, LORA_SHAPES[2], SLOT_MIXES["mixed"], torch.float32, torch.device("cpu"), strided=True)
    assert not inp.x.is_contiguous() and not inp.a.is_contiguous() and not inp.b.is_contiguous()
    assert inp.slots.stride(0) == 2 and inp.slots.tolist() == SLOT_MIXES["mixed"]
    outside = outside_view_bits(inp.y)
    assert outside is not None and outside.isnan().all()
    assert inp.a._base is not None and inp.a._base[:, 16:].isnan().all()
    want = REFERENCE.lora_shrink(inp.x.contiguous(), inp.a.contiguous(), inp.slots.contiguous())
    assert want[inp.slots < 0].eq(0).all() and want.isfinite().all()


def test_reference_is_the_per_token_formula() -> None:
    """The oracle itself, against a float64 loop over tokens: grouping, -1 rows, in-place expand."""
    gen = torch.Generator().manual_seed(2)
    a, b = lora_weights(gen, LORA_SHAPES[4])
    slots = torch.tensor(SLOT_MIXES["unsorted"])
    x, y = torch.randn(len(slots), 67, generator=gen), torch.randn(len(slots), 300, generator=gen)
    shrunk = REFERENCE.lora_shrink(x, a, slots)
    y_before = y.clone()
    assert REFERENCE.lora_expand(y, shrunk, b, slots) is y
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            assert shrunk[t].eq(0).all() and torch.equal(y[t], y_before[t])
            continue
        row = x[t].double() @ a[s].double().T
        torch.testing.assert_close(shrunk[t].double(), row, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(y[t].double(), y_before[t].double() + row @ b[s].double().T, atol=1e-4, rtol=1e-4)
