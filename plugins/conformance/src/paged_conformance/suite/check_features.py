"""Optional attention features (sliding window, logits soft cap): tested when declared, N/A otherwise."""

from __future__ import annotations

import pytest

from paged_conformance.grid import Case
from paged_conformance.harness import check_layers
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
    spec = AttentionSpec(case.num_heads, case.num_kv_heads, case.head_size, sliding_window=case.block_size + 3)
    check_layers(conformance, case, spec, "sliding-window attention vs oracle")


@pytest.mark.paged_capability("soft_cap")
@pytest.mark.paged_cases("features")
def test_soft_cap(conformance: Conformance, case: Case) -> None:
    """Scores capped as ``c * tanh(s / c)`` (after scaling) match the oracle."""
    if not conformance.caps.logits_soft_cap:
        pytest.skip("N/A: logits soft cap not declared")
    spec = AttentionSpec(case.num_heads, case.num_kv_heads, case.head_size, logits_soft_cap=SOFT_CAP)
    check_layers(conformance, case, spec, "soft-capped attention vs oracle")
