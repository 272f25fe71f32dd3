"""Declared capabilities: normalisation of plugin input and the refusal messages."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import AttentionSpec, Availability, BackendCapabilities, GraphSupport, UnsupportedConfigError
from paged_core.errors import PagedError


def caps(**kw: object) -> BackendCapabilities:
    base: dict[str, object] = {"dtypes": {torch.float32, torch.bfloat16}, "block_sizes": (16, 32)}
    base.update(kw)
    return BackendCapabilities(**base)  # type: ignore[arg-type]


def test_plain_values_are_normalised() -> None:
    c = caps(dtypes=[torch.float32], block_sizes=[16], head_sizes=[64, 128], graph_support=1)
    assert c.dtypes == frozenset({torch.float32}) and c.block_sizes == (16,)
    assert c.head_sizes == frozenset({64, 128})
    assert c.graph_support is GraphSupport.UNIFORM_DECODE
    assert c.to_dict()["graph_support"] == "uniform_decode"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"graph_support": 7}, "graph_support"),
        ({"dtypes": ["float32"]}, "dtypes"),
        ({"dtypes": frozenset()}, "at least one dtype"),
        ({"block_sizes": ()}, "block_sizes"),
        ({"block_sizes": (16, 0)}, "block_sizes"),
        ({"head_sizes": [64.0]}, "head_sizes"),
        ({"gqa_ratios": 4}, "gqa_ratios"),
        ({"kv_cache_dtypes": [torch.float32, "fp8"]}, "kv_cache_dtypes"),
        ({"batch_invariant": 1}, "batch_invariant must be True or False, got 1"),
        ({"batch_invariant": "yes"}, "batch_invariant"),
    ],
)
def test_bad_declarations_are_refused_by_name(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(UnsupportedConfigError, match=needle):
        caps(**kw)


def test_check_lists_every_problem_with_supported_values() -> None:
    c = caps(head_sizes={64, 128}, gqa_ratios={1, 4})
    spec = AttentionSpec(num_heads=16, num_kv_heads=2, head_size=80, sliding_window=128, logits_soft_cap=30.0)
    with pytest.raises(UnsupportedConfigError) as err:
        c.check(spec, torch.float16, block_size=8)
    msg = str(err.value)
    for needle in (
        "dtype torch.float16 not supported (supported: bfloat16, float32)",
        "head_size 80 not supported (supported: [64, 128])",
        "block_size 8 not supported (supported: [16, 32])",
        "GQA ratio 8 not supported (supported: [1, 4])",
        "sliding window not supported",
        "logits soft cap not supported",
    ):
        assert needle in msg


def test_check_accepts_what_is_declared() -> None:
    c = caps(head_sizes=None, gqa_ratios=None, sliding_window=True)
    c.check(AttentionSpec(8, 2, 96, sliding_window=64), torch.bfloat16, block_size=32)


def test_kv_cache_dtype_defaults_to_compute_dtypes() -> None:
    c = caps()
    assert c.effective_kv_cache_dtypes == c.dtypes
    with pytest.raises(UnsupportedConfigError, match="kv_cache_dtype"):
        c.check(AttentionSpec(4, 4, 64), torch.float32, 16, kv_cache_dtype=torch.float16)


def test_attention_spec_validation_and_defaults() -> None:
    spec = AttentionSpec(num_heads=9, num_kv_heads=3, head_size=64)
    assert spec.gqa_ratio == 3 and spec.softmax_scale == 64**-0.5
    assert AttentionSpec(4, 4, 64, scale=0.3).softmax_scale == 0.3
    with pytest.raises(UnsupportedConfigError, match="multiple"):
        AttentionSpec(num_heads=9, num_kv_heads=2, head_size=64)
    with pytest.raises(UnsupportedConfigError, match="sliding_window"):
        AttentionSpec(4, 4, 64, sliding_window=0)


def test_availability_normalises_and_checks_device() -> None:
    a = Availability(available=1, reason=None, device="cpu")  # type: ignore[arg-type]
    assert a.available is True and a.reason == ""
    with pytest.raises(PagedError, match="not a torch device"):
        Availability(True, device="warp-drive")


def test_batch_invariance_is_declared_not_assumed() -> None:
    assert caps().batch_invariant is False and caps().to_dict()["batch_invariant"] is False
    declared = caps(batch_invariant=True)
    assert declared.batch_invariant is True and declared.to_dict()["batch_invariant"] is True
