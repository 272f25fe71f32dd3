"""One benchmark from options to report: build the workload, run it, assemble every figure."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from paged_bench import workloads
from paged_bench.kv_util import run_kv_util
from paged_bench.machine import machine_info
from paged_bench.options import BenchOptions
from paged_bench.report import build_report, kv_util_figures

log = logging.getLogger("paged.bench")


def workload_requests(opts: BenchOptions) -> list[workloads.BenchRequest]:
    """The requests ``opts`` asks for (kv-util lengths follow its ``max_len``), output capped if asked."""
    if opts.workload == "kv-util":
        num = workloads.WORKLOADS["kv-util"][0] if opts.num_requests is None else opts.num_requests
        requests = workloads.kv_util(num, opts.seed, max_len=opts.kv_util.max_len)
    else:
        requests = workloads.build(opts.workload, opts.num_requests, opts.seed)
    return workloads.cap_output(requests, opts.output_len)


def run_bench(opts: BenchOptions, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the workload of ``opts`` with its baselines; returns the report (see the README for its schema)."""
    requests = workload_requests(opts)
    if not opts.uses_model:
        if opts.baselines:
            log.warning(
                "kv-util runs no model: --baseline %s ignored (its baseline is the reservation allocator)",
                ",".join(opts.baselines),
            )
        paged, reserved, extra = run_kv_util(requests, opts.kv_util, opts.progress)
        kv_dtypes = None
        if opts.kv_dtypes:
            from paged_bench.kv_dtypes import run_kv_util_kv_dtypes

            kv_dtypes = run_kv_util_kv_dtypes(requests, opts.kv_util, opts.engine, opts.kv_dtypes, opts.progress)
        return build_report(
            config=opts.to_dict(),
            machine=machine_info(torch.device("cpu")),
            requests=requests,
            kv_util=kv_util_figures(paged, reserved, extra),
            kv_dtypes=kv_dtypes,
            argv=argv,
        )
    from paged_bench.model_bench import run_model_workload

    parts = run_model_workload(opts, requests)
    return build_report(
        config=opts.to_dict(),
        machine=machine_info(parts["device"]),
        requests=requests,
        runs=parts["runs"],
        roofline=parts["roofline"],
        engine=parts["engine"],
        model=parts["model"],
        kv_dtypes=parts.get("kv_dtypes"),
        argv=argv,
    )
