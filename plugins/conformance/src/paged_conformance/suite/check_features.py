"""Optional attention features (sliding window, logits soft cap): tested when declared, N/A otherwise."""

from __future__ import annotations

import pytest

from paged_conformance.batch import make_batch
from paged_conformance.grid import NUM_KV_HEADS, Case
from paged_conformance.harness import assert_close, run_batch
from paged_conformance.session import Conformance
from paged_core.api import AttentionSpec

SOFT_CAP = 2.0
"""Small enough that capping changes the scores the suite's queries produce."""


@pytest.mark.paged_capability("sliding_window")
@pytest.mark.paged_cases("features")
def test_sliding_window(conformance: Conformance, case: Case) -> None:
    """A window of block_size + 3 keys, crossing block boundaries, matches the oracle."""
    if not conformance.caps.sliding_window:
        pytest.skip("N/A: sliding window not declared")
    spec = AttentionSpec(case.num_heads, NUM_KV_HEADS, case.head_size, sliding_window=case.block_size + 3)
    batch = make_batch(case, spec=spec)
    conformance.caps.check(spec, case.dtype, case.block_size)
    step = run_batch(conformance.backend(), batch, spec)
    assert_close(step.output, conformance.expected(batch, spec), batch, "sliding-window attention")


@pytest.mark.paged_capability("soft_cap")
@pytest.mark.paged_cases("features")
def test_soft_cap(conformance: Conformance, case: Case) -> None:
    """Scores capped as ``c * tanh(s / c)`` (after scaling) match the oracle."""
    if not conformance.caps.logits_soft_cap:
        pytest.skip("N/A: logits soft cap not declared")
    spec = AttentionSpec(case.num_heads, NUM_KV_HEADS, case.head_size, logits_soft_cap=SOFT_CAP)
    batch = make_batch(case, spec=spec)
    conformance.caps.check(spec, case.dtype, case.block_size)
    step = run_batch(conformance.backend(), batch, spec)
    assert_close(step.output, conformance.expected(batch, spec), batch, "soft-capped attention")
