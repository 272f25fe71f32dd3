"""Paged attention against the oracle over the declared grid of dtypes, sizes and batch kinds."""

from __future__ import annotations

import pytest

from paged_conformance.batch import make_batch
from paged_conformance.grid import Case
from paged_conformance.harness import assert_close, run_batch
from paged_conformance.session import Conformance


@pytest.mark.paged_cases("attention")
def test_attention(conformance: Conformance, case: Case) -> None:
    """Decode, prefill, mixed and prefix-cached batches at every length edge match the oracle."""
    batch = make_batch(case)
    conformance.caps.check(batch.spec, case.dtype, case.block_size)  # declared, so it must be accepted
    step = run_batch(conformance.backend(), batch)
    assert step.output.dtype == case.dtype, f"attention returned {step.output.dtype}, expected the query's {case.dtype}"
    assert_close(step.output, conformance.expected(batch), batch)
