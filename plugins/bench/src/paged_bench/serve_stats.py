"""Streaming latency figures of ``paged bench serve``: one request's chunk timeline, and a run's aggregates.

Definitions (every time is seconds on one monotonic clock, measured by the client):

* **TTFT**: from sending the request to the first chunk that carries text.
* **ITL** (inter-token latency): the gaps between consecutive token-carrying
  chunks after that first text chunk. A chunk can carry more than one token
  (the server coalesces what a slow reader has not yet taken), so ITL is per
  chunk, as every streaming benchmark measures it; TPOT is the per-token view.
* **TPOT** (time per output token): ``(end - first text) / (tokens - 1)``.
* **Output tok/s**: completion tokens of the whole run over its wall time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paged_bench.result import percentile


@dataclass
class Timeline:
    """What the client saw of one streamed request.

    ``chunks`` holds ``(seconds since start, text)`` for every chunk with a
    choice in it (the usage-only chunk at the end is not one); ``usage_tokens``
    is the final usage's ``completion_tokens`` when the server sent it.
    """

    start: float
    end: float | None = None
    chunks: list[tuple[float, str]] = field(default_factory=list)
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None

    def add_chunk(self, at: float, text: str) -> None:
        """Record one chunk carrying a choice, received at ``at``."""
        self.chunks.append((at, text))

    @property
    def first_text_at(self) -> float | None:
        """When the first chunk with non-empty text arrived (None: no text at all)."""
        return next((t for t, text in self.chunks if text), None)

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first text chunk."""
        first = self.first_text_at
        return None if first is None else first - self.start

    def itl(self) -> list[float]:
        """Gaps between consecutive chunks from the first text chunk on."""
        first = self.first_text_at
        if first is None:
            return []
        times = [t for t, _ in self.chunks if t >= first]
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def output_tokens(self) -> int:
        """Completion tokens: the server's usage figure, else one per token-carrying chunk."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunks)

    def tpot(self) -> float | None:
        """Seconds per output token after the first (None for a single token or a request without text)."""
        first = self.first_text_at
        if first is None or self.end is None or self.output_tokens < 2:
            return None
        return (self.end - first) / (self.output_tokens - 1)


def summarize(values: Sequence[float], keep_values: bool = False) -> dict[str, Any] | None:
    """p50, p90, p99, mean, min, max and count (and every value when asked); None for no values."""
    if not values:
        return None
    out: dict[str, Any] = {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "count": len(values),
    }
    if keep_values:
        out["values"] = list(values)
    return out


def run_figures(name: str, timelines: Sequence[Timeline], seconds: float, expected_tokens: int) -> dict[str, Any]:
    """One variant's record: throughput, TTFT/ITL/TPOT/latency summaries and how tokens were counted.

    ``expected_tokens`` is what the workload asked for (EOS ignored), so a
    shortfall (a failed or cut request) shows as ``output_tokens`` below it.
    """
    if not seconds > 0:
        raise ValueError(f"{name}: run time must be > 0 seconds, got {seconds}")
    done = [t for t in timelines if t.error is None]
    ttft = [v for v in (t.ttft for t in done) if v is not None]
    itl = [g for t in done for g in t.itl()]
    tpot = [v for v in (t.tpot() for t in done) if v is not None]
    latency = [t.end - t.start for t in done if t.end is not None]
    output = sum(t.output_tokens for t in done)
    prompt = sum(t.prompt_tokens or 0 for t in done)
    errors = [t.error for t in timelines if t.error is not None]
    return {
        "name": name,
        "seconds": seconds,
        "num_requests": len(timelines),
        "completed": len(done),
        "failed": len(errors),
        "errors": errors[:5],
        "prompt_tokens": prompt,
        "output_tokens": output,
        "expected_output_tokens": expected_tokens,
        "token_count_source": "usage" if done and all(t.usage_tokens is not None for t in done) else "chunks",
        "output_tok_s": output / seconds,
        "total_tok_s": (prompt + output) / seconds,
        "requests_per_s": len(done) / seconds,
        "ttft_s": summarize(ttft, keep_values=True),
        "itl_s": summarize(itl),
        "tpot_s": summarize(tpot),
        "latency_s": summarize(latency),
    }


RATIO_FIGURES = (
    ("output_tok_s", ("output_tok_s",)),
    ("ttft_p50", ("ttft_s", "p50")),
    ("ttft_p99", ("ttft_s", "p99")),
    ("itl_p50", ("itl_s", "p50")),
    ("itl_p99", ("itl_s", "p99")),
)
"""(ratio suffix, path into a run record) of every figure compared against the baseline variant."""


def _figure(run: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = run
    for key in path:
        if value is None:
            return None
        value = value[key]
    return None if value is None else float(value)


def ratios(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``<variant>_vs_<baseline>_<figure>``: each later variant's figure over the first (the baseline)'s.

    Output tok/s above 1 and latencies below 1 mean the variant is better.
    A figure missing on either side (or zero at the baseline) is left out.
    """
    if len(runs) < 2:
        return {}
    base = runs[0]
    out: dict[str, float] = {}
    for run in runs[1:]:
        for suffix, path in RATIO_FIGURES:
            a, b = _figure(run, path), _figure(base, path)
            if a is not None and b:
                out[f"{run['name']}_vs_{base['name']}_{suffix}"] = a / b
    return out
