"""The benchmark report: every figure, the ratios between systems, the goals, the machine and the configuration.

The layout is documented in this package's README and checked by
:func:`paged_bench.schema.validate_report`.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any

from paged_bench.constrained import CONSTRAINED, SAME_LENGTHS
from paged_bench.lora import LORA
from paged_bench.result import RunResult, percentile
from paged_bench.trace import UtilizationTrace
from paged_bench.workloads import BenchRequest

SCHEMA_VERSION = 1

# (workload, goal name, figure key, target): the goals, checked against this run's figures.
GOALS: tuple[tuple[str, str, str, float], ...] = (
    ("throughput", "output tok/s vs transformers static batching", "paged_vs_hf-static", 3.0),
    ("throughput", "output tok/s vs transformers continuous batching", "paged_vs_hf-cb", 6.0),
    ("throughput", "share of the GEMM roofline", "roofline_fraction", 0.35),
    # Like for like: the same prompts and output lengths unconstrained (a constrained request stops early, and
    # against the full-length run the fixed prefill alone would sink its output tok/s).
    ("throughput", "constrained output tok/s vs unconstrained, same lengths", "constrained_vs_same_lengths", 0.9),
    # The same requests on N random adapters (--lora N) against the base model, same weights and engine settings.
    ("throughput", "LoRA output tok/s vs the base model", "lora_vs_paged", 0.75),
    # --kv-dtypes: the same requests and weights with the KV cache in fp8 (e4m3) against the compute dtype's, and the
    # NLL of a fixed text through each cache (agreement: 1 - the relative difference; 0.99 is within 1%).
    ("throughput", "fp8 (e4m3) KV cache output tok/s vs auto", "kv_fp8_e4m3_vs_auto", 0.9),
    ("throughput", "fp8 (e4m3) KV cache: NLL of a fixed text within 1% of auto", "nll_fp8_e4m3_agreement", 0.99),
    ("throughput", "int8 KV cache: NLL of a fixed text within 1% of auto", "nll_int8_agreement", 0.99),
    ("kv-util", "KV utilization", "utilization", 0.95),
    ("kv-util", "peak concurrent requests vs reservation", "peak_concurrency_ratio", 3.0),
    # --kv-dtypes: the same byte budget with the KV cache quantized against bf16.
    (
        "kv-util",
        "peak concurrent requests, fp8 (e4m3) KV vs bf16, one budget",
        "peak_concurrency_fp8_e4m3_vs_bfloat16",
        1.9,
    ),
    ("kv-util", "peak concurrent requests, int8 KV vs bf16, one budget", "peak_concurrency_int8_vs_bfloat16", 1.9),
    ("prefix", "fewer prefill tokens with caching on", "prefill_reduction", 0.90),
    ("prefix", "TTFT p50 speed-up with caching on", "ttft_p50_speedup", 5.0),
    ("decode-1", "share of the weight-bandwidth bound", "roofline_fraction", 0.70),
)


def workload_stats(requests: Sequence[BenchRequest]) -> dict[str, Any]:
    """Size of the workload as run: requests, prompt and output tokens (with extremes)."""
    prompts = [len(r.prompt_token_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    return {
        "num_requests": len(requests),
        "prompt_tokens": sum(prompts),
        "output_tokens": sum(outputs),
        "prompt_len": {"min": min(prompts), "max": max(prompts), "mean": sum(prompts) / len(prompts)},
        "output_len": {"min": min(outputs), "max": max(outputs), "mean": sum(outputs) / len(outputs)},
    }


def ratios(runs: Sequence[RunResult]) -> dict[str, float]:
    """Our output tok/s over each other system's (``paged_vs_<name>``), plus the constrained, LoRA and
    prefix-cache figures when present."""
    by_name = {r.name: r for r in runs}
    ours = by_name.get("paged")
    out: dict[str, float] = {}
    if ours is None:
        return out
    for r in runs:
        if r is not ours:
            out[f"paged_vs_{r.name}"] = ours.output_tok_s / r.output_tok_s
            if ours.decode_tok_s and r.decode_tok_s:  # decode phase alone (decode-1: the one stream's token rate)
                out[f"decode_paged_vs_{r.name}"] = ours.decode_tok_s / r.decode_tok_s
    constrained = by_name.get(CONSTRAINED)
    if constrained is not None:  # output tokens per second: constrained requests stop when their grammar ends
        out["constrained_vs_paged"] = constrained.output_tok_s / ours.output_tok_s
        same = by_name.get(SAME_LENGTHS)
        if same is not None:  # the same tokens unconstrained: the cost of constraining alone
            out["constrained_vs_same_lengths"] = constrained.output_tok_s / same.output_tok_s
    lora = by_name.get(LORA)
    if lora is not None:  # the same requests and tokens on adapters: what serving them costs
        out["lora_vs_paged"] = lora.output_tok_s / ours.output_tok_s
    off = by_name.get("paged-no-prefix-cache")
    if off is not None:
        if off.prefill_tokens_computed and ours.prefill_tokens_computed is not None:
            out["prefill_reduction"] = 1.0 - ours.prefill_tokens_computed / off.prefill_tokens_computed
        p_on, p_off = ours.ttft_p50(), off.ttft_p50()
        if p_on and p_off:
            out["ttft_p50_speedup"] = p_off / p_on
        if ours.ttft and off.ttft:
            out["ttft_p99_speedup"] = percentile(off.ttft, 99) / percentile(ours.ttft, 99)
    return out


def kv_util_figures(
    paged: UtilizationTrace, reserved: UtilizationTrace, extra: dict[str, UtilizationTrace] | None = None
) -> dict[str, Any]:
    """Both allocators' traces and the two headline figures; a sliding model adds its full-accounting run and
    ``sliding_vs_full_peak_ratio`` (peak concurrent requests of the KV-cache groups over full accounting)."""
    figures: dict[str, Any] = {
        "paged": paged.to_dict(),
        "reserved": reserved.to_dict(),
        "utilization": paged.utilization,
        "peak_concurrency_ratio": paged.peak_concurrent / max(1, reserved.peak_concurrent),
    }
    full = (extra or {}).get("full_accounting")
    if full is not None:
        figures["full_accounting"] = full.to_dict()
        figures["sliding_vs_full_peak_ratio"] = paged.peak_concurrent / max(1, full.peak_concurrent)
    return figures


def goals(workload: str, figures: dict[str, float]) -> list[dict[str, Any]]:
    """The issue's goals for ``workload``: target, this run's value (None when not measured) and whether met."""
    out = []
    for w, name, key, target in GOALS:
        if w != workload:
            continue
        value = figures.get(key)
        out.append(
            {
                "goal": name,
                "figure": key,
                "target": target,
                "value": value,
                "met": None if value is None else value >= target,
            }
        )
    return out


def build_report(
    *,
    config: dict[str, Any],
    machine: dict[str, Any],
    requests: Sequence[BenchRequest],
    runs: Sequence[RunResult] = (),
    roofline: dict[str, Any] | None = None,
    kv_util: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    kv_dtypes: dict[str, Any] | None = None,
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Assemble the JSON report (see the README for every field); ``kv_dtypes``: the ``--kv-dtypes`` figures
    (:mod:`paged_bench.kv_dtypes`), whose ratios join the report's."""
    rat = ratios(runs)
    if kv_dtypes is not None:
        rat.update(kv_dtypes["ratios"])
    figures: dict[str, float] = dict(rat)
    if roofline is not None:
        figures["roofline_fraction"] = roofline["fraction"]
    if kv_util is not None:
        figures["utilization"] = kv_util["utilization"]
        figures["peak_concurrency_ratio"] = kv_util["peak_concurrency_ratio"]
    return {
        "schema_version": SCHEMA_VERSION,
        "workload": config["workload"],
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv if argv is None else argv),
        "config": config,
        "engine": engine,
        "model": model,
        "machine": machine,
        "workload_stats": workload_stats(requests),
        "runs": [r.to_dict() for r in runs],
        "ratios": rat,
        "roofline": roofline,
        "kv_util": kv_util,
        "kv_dtypes": kv_dtypes,
        "goals": goals(config["workload"], figures),
    }
