"""One system's run of a workload: timings and token counts, and the figures derived from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """p50, p99, mean, min, max and every value (in request order)."""
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


@dataclass
class RunResult:
    """What one system did with one workload (all requests submitted at once at time 0).

    Output tokens are those the requests asked for: a system that pads a
    static batch to its longest request does the extra work for nothing.
    """

    name: str
    seconds: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    ttft: list[float] | None = None
    """Seconds from submission to each request's first token (request order); None where not observable."""
    prefill_tokens_computed: int | None = None
    """Prompt tokens run through the model (prefix-cache hits skipped, recompute after preemption included)."""
    prefix_hit_rate: float | None = None
    decode_tok_s: float | None = None
    """Tokens per second once every request has its first token (the pure decode phase)."""
    steps: int | None = None
    peak_running: int | None = None
    preemptions: int | None = None
    spec_acceptance_rate: float | None = None
    """Speculative decoding: draft tokens kept / verified in this run (None without speculation)."""
    spec_mean_accepted_length: float | None = None
    """Tokens produced per verifying sequence step (kept drafts + 1)."""
    structured: dict[str, Any] | None = None
    """Constrained runs: mask time per step, rows per step, compile times, finish reasons (see ``engine_run``)."""
    lora: dict[str, Any] | None = None
    """LoRA runs: the adapters (count, rank, targets), how requests were spread, slots and loads (see ``lora``)."""
    experts_calls: int | None = None
    """transformers baselines on a MoE model: forward calls of its routed-experts modules while timed (``None``:
    not counted, or no routed experts)."""

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"{self.name}: run time must be > 0 seconds, got {self.seconds}")

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tok_s(self) -> float:
        """Prompt plus output tokens per second."""
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    def ttft_p50(self) -> float | None:
        return percentile(self.ttft, 50) if self.ttft else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (see the schema in the bench README); ``structured`` only for a constrained run,
        ``lora`` only for a LoRA run."""
        record: dict[str, Any] = {
            "name": self.name,
            "seconds": self.seconds,
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "total_tok_s": self.total_tok_s,
            "ttft_s": summarize(self.ttft) if self.ttft else None,
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "prefix_hit_rate": self.prefix_hit_rate,
            "decode_tok_s": self.decode_tok_s,
            "steps": self.steps,
            "peak_running": self.peak_running,
            "preemptions": self.preemptions,
            "spec_acceptance_rate": self.spec_acceptance_rate,
            "spec_mean_accepted_length": self.spec_mean_accepted_length,
        }
        if self.structured is not None:
            record["structured"] = self.structured
        if self.lora is not None:
            record["lora"] = self.lora
        if self.experts_calls is not None:
            record["experts_calls"] = self.experts_calls
        return record
