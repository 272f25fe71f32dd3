"""``paged bench serve`` from options to report: each server variant in turn, the same requests, one client loop.

Variants run one after the other (never side by side: they would share the
machine), each on a fresh server, each after the same untimed warm-up. The
warm-up prompts come from another seed, so they leave nothing in the prefix
cache that the timed requests could hit.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from paged_bench import workloads
from paged_bench.serve_client import bench_server
from paged_bench.serve_report import build_serve_report
from paged_bench.serve_run import VARIANTS, ServerProcess, is_variant, started
from paged_bench.serve_stats import run_figures

log = logging.getLogger("paged.bench")

WARMUP_SEED_OFFSET = 1_000_003
WARMUP_MAX_TOKENS = 4


@dataclass(frozen=True)
class ServeBenchOptions:
    """One ``paged bench serve`` invocation.

    ``servers`` are variants to start (see :data:`~paged_bench.serve_run.VARIANTS`);
    ``urls`` instead names running servers (``[(name, url)]``) and starts
    nothing; a variant ending ``+sync``/``+async`` runs the engine core's loop
    in turn or overlapped (asynchronous scheduling). ``engine_flags`` and ``serve_args`` are passed to every started
    ``paged serve``. The first variant is the baseline of the ratios.
    """

    servers: tuple[str, ...] = VARIANTS
    urls: tuple[tuple[str, str], ...] = ()
    workload: str = "throughput"
    num_requests: int | None = None
    output_len: int | None = None
    seed: int = 0
    concurrency: int = 32
    warmup_requests: int | None = None
    """Untimed requests before each variant's run (None: one per client, at most the run's size)."""
    engine_flags: tuple[str, ...] = ()
    serve_args: tuple[str, ...] = ()
    api_key: str | None = None
    server_timeout: float = 600.0
    progress: bool = True
    device: str = "cpu"
    """The device the servers run on, for the machine record (``cuda`` where torch sees a GPU)."""

    def __post_init__(self) -> None:
        bad = [s for s in self.servers if not is_variant(s)]
        if bad:
            choices = ", ".join(VARIANTS)
            raise ValueError(f"unknown server variant(s) {', '.join(bad)}; choose from {choices} (+sync or +async)")
        if self.workload not in workloads.WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; choose one of {', '.join(workloads.WORKLOADS)}")
        if not self.servers and not self.urls:
            raise ValueError("nothing to measure: no --servers and no --url")
        for name in ("concurrency", "num_requests", "output_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.warmup_requests is not None and self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")

    @property
    def variant_names(self) -> list[str]:
        """What the report calls each measured server, in run order."""
        return [n for n, _ in self.urls] if self.urls else list(self.servers)

    def to_dict(self) -> dict[str, Any]:
        """The configuration, for the report (the API key is never written)."""
        return {
            "workload": self.workload,
            "servers": self.variant_names,
            "baseline": self.variant_names[0],
            "num_requests": self.num_requests,
            "output_len": self.output_len,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "warmup_requests": self._warmup_count(),
            "engine_flags": list(self.engine_flags),
            "serve_args": list(self.serve_args),
            "external": bool(self.urls),
        }

    def _warmup_count(self, run_size: int | None = None) -> int:
        if self.warmup_requests is not None:
            return self.warmup_requests
        return self.concurrency if run_size is None else min(self.concurrency, run_size)

    def requests(self) -> list[workloads.BenchRequest]:
        """The timed requests: the workload, shrunk and capped as asked."""
        return workloads.cap_output(workloads.build(self.workload, self.num_requests, self.seed), self.output_len)

    def warmup(self, run_size: int) -> list[workloads.BenchRequest]:
        """Short untimed requests with prompts of another seed (no prefix-cache hits for the timed ones)."""
        n = self._warmup_count(run_size)
        if n == 0:
            return []
        reqs = workloads.build(self.workload, n, self.seed + WARMUP_SEED_OFFSET)
        return workloads.cap_output(reqs, WARMUP_MAX_TOKENS)


def measure(
    name: str,
    url: str,
    opts: ServeBenchOptions,
    requests: Sequence[workloads.BenchRequest],
    server: ServerProcess | None,
) -> dict[str, Any]:
    """Run the clients against one server; its run record (see the README)."""
    if opts.progress:
        print(
            f"paged bench serve: {name}: {len(requests)} requests, {opts.concurrency} concurrent streams",
            file=sys.stderr,
        )
    log.info("%s: %d requests, %d concurrent streams, at %s", name, len(requests), opts.concurrency, url)
    timelines, seconds, model = asyncio.run(
        bench_server(url, requests, opts.concurrency, opts.api_key, warmup=opts.warmup(len(requests)))
    )
    record = run_figures(name, timelines, seconds, expected_tokens=sum(r.max_tokens for r in requests))
    server_info = (
        server.to_dict()
        if server is not None
        else {"url": url, "command": None, "startup_s": None, "notes": ["external server (--url)"]}
    )
    return {"name": name, "server": server_info, "model": model, **{k: v for k, v in record.items() if k != "name"}}


def run_serve_bench(opts: ServeBenchOptions, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure every variant of ``opts`` in order; returns the report."""
    import torch

    from paged_bench.machine import machine_info

    requests = opts.requests()
    runs = []
    if opts.urls:
        for name, url in opts.urls:
            runs.append(measure(name, url, opts, requests, None))
    else:
        for name in opts.servers:
            if opts.progress:
                print(f"paged bench serve: starting {name}", file=sys.stderr)
            with started(
                name, opts.engine_flags, opts.serve_args, timeout=opts.server_timeout, api_key=opts.api_key
            ) as server:
                runs.append(measure(name, server.url, opts, requests, server))
    machine = machine_info(torch.device(opts.device))
    return build_serve_report(opts.to_dict(), machine, requests, runs, argv=argv)
