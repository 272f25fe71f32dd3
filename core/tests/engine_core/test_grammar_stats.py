"""The core's structured-output counters: requests, compile failures by kind, compile and mask histograms."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
import torch

from paged_core.engine_core.grammars import Grammars
from paged_core.engine_core.messages import GRAMMAR_COMPILE_BUCKETS, GRAMMAR_MASK_BUCKETS, GrammarStats
from paged_core.structured import ConstraintCompileError, ConstraintTimeoutError, StructuredOutputs


class _Compiled:
    def __init__(self, compile_s: float, cached: bool = False) -> None:
        self.compile_s = compile_s
        self.cached = cached


class _Compiler:
    """Hands out futures settled in submission order by ``outcomes`` (a compile time, or an error to raise)."""

    vocab_size = 64

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes

    def submit(self, spec: StructuredOutputs) -> Future[Any]:
        future: Future[Any] = Future()
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        elif isinstance(outcome, _Compiled):
            future.set_result(outcome)
        else:
            future.set_result(_Compiled(outcome))
        return future

    def close(self) -> None:
        pass


def test_requests_compiles_and_failures_are_counted_by_kind() -> None:
    cache_hit = _Compiled(5.0, cached=True)  # the compiler's cache answered: a request, but no compile
    outcomes = [
        0.003,
        ConstraintCompileError("json", "bad"),
        ConstraintTimeoutError("regex", "slow"),
        20.0,
        0.003,
        cache_hit,
    ]
    grammars = Grammars(lambda: _Compiler(outcomes), lambda logits, bitmask, rows: None)  # type: ignore[arg-type,return-value]
    assert grammars.stats.snapshot() == GrammarStats()  # nothing constrained yet: the empty struct
    for i in range(6):
        grammars.submit(f"r{i}", StructuredOutputs(regex="a+"))
    ready, errors = grammars.ready()
    assert sorted(ready) == ["r0", "r3", "r4", "r5"] and sorted(errors) == ["r1", "r2"]
    g = grammars.stats.snapshot()
    assert (g.requests, g.compile_errors, g.compile_timeouts) == (6, 1, 1)
    at = next(i for i, b in enumerate(GRAMMAR_COMPILE_BUCKETS) if 0.003 <= b)
    assert g.compile_buckets[at] == 2 and g.compile_buckets[-1] == 1  # 20 s: past the last bound
    assert sum(g.compile_buckets) == 3 and abs(g.compile_seconds - 20.006) < 1e-9


def test_each_masked_step_lands_in_one_bucket_with_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fill is llguidance's (tested with real grammars elsewhere); here only the step's accounting counts.
    monkeypatch.setattr("paged_core.engine_core.grammars.fill_bitmask", lambda matchers, bitmask: None)
    grammars = Grammars(lambda: _Compiler([]), lambda logits, bitmask, rows: None)  # type: ignore[arg-type,return-value]
    grammars.stats.requests = 1  # a request was constrained (its compile is not part of this test)
    logits = torch.zeros(4, 64)
    grammars.mask(logits, [0, 2, 3], [object()] * 3)  # type: ignore[list-item]
    grammars.mask(logits, [1], [object()])  # type: ignore[list-item]
    grammars.mask(logits, [], [])  # no constrained rows: not a masked step
    g = grammars.stats.snapshot()
    assert len(g.mask_buckets) == len(GRAMMAR_MASK_BUCKETS) + 1 and sum(g.mask_buckets) == 2
    assert g.mask_rows == 4 and g.mask_seconds == grammars.stats.seconds > 0
