"""``paged bench serve``: streaming clients against ``paged serve`` variants (the options and the run).

Examples::

    paged bench serve                                   # mp and inproc, 256 throughput requests, 32 streams
    paged bench serve --servers mp --num-requests 64 --concurrency 16 --json serve.json
    paged bench serve --url mp=http://127.0.0.1:8000,inproc=http://127.0.0.1:8001
    paged bench serve --servers mp --compare-async                 # mp+sync, then mp+async (asynchronous scheduling)
    paged bench serve --servers mp --compare-async --serve-workload decode-1   # one stream's ITL, both loops

Not a subcommand module of its own (no ``register``): ``paged bench`` adds
these options and hands ``serve`` over to :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from typing import Any

from paged_core.errors import ConfigError


def add_serve_bench_args(parser: argparse.ArgumentParser) -> None:
    """The options only ``paged bench serve`` reads."""
    g = parser.add_argument_group("serve (paged bench serve only)")
    g.add_argument(
        "--servers",
        default="mp,inproc",
        metavar="LIST",
        help="server variants to start, in order; the first is the baseline of the ratios. mp: "
        "`paged serve` (API server + engine-core process); inproc: `paged serve --engine-in-process`",
    )
    g.add_argument(
        "--url",
        default=None,
        metavar="[NAME=]URL,...",
        help="measure servers that are already running instead of starting any (ignores --servers)",
    )
    g.add_argument("--concurrency", type=int, default=32, help="streams open at once (default 32)")
    g.add_argument(
        "--compare-async",
        action="store_true",
        help="run each server variant twice, NAME+sync (--no-async-scheduling, the baseline) then NAME+async "
        "(--async-scheduling); a variant may also be named with its suffix in --servers",
    )
    g.add_argument(
        "--serve-workload",
        default="throughput",
        metavar="NAME",
        help="the requests the clients stream (default throughput; decode-1: one request of 256 tokens, for ITL)",
    )
    g.add_argument(
        "--warmup-requests",
        type=int,
        default=None,
        help="untimed short requests before each variant (default: one per stream)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("PAGED_API_KEY"),
        help="bearer key for the servers (default $PAGED_API_KEY, which started servers also read)",
    )
    g.add_argument(
        "--serve-args",
        default="",
        metavar="'ARGS'",
        help="extra `paged serve` options for every started server, e.g. '--max-queued-requests 512'",
    )
    g.add_argument(
        "--server-timeout",
        type=float,
        default=600.0,
        help="seconds a started server may take to answer /health (default 600)",
    )


def options_from(args: argparse.Namespace) -> Any:
    """:class:`~paged_bench.serve_bench.ServeBenchOptions` from parsed arguments (errors name the option)."""
    from paged_bench.serve_bench import ServeBenchOptions
    from paged_bench.serve_run import engine_argv, parse_urls, parse_variants

    try:
        urls = tuple(parse_urls(args.url)) if args.url else ()
        servers = () if urls else parse_variants(args.servers, compare_async=args.compare_async)
        return ServeBenchOptions(
            servers=servers,
            urls=urls,
            workload=args.serve_workload,
            num_requests=args.num_requests,
            output_len=args.output_len,
            seed=args.seed,
            concurrency=args.concurrency,
            warmup_requests=args.warmup_requests,
            engine_flags=tuple(engine_argv(args)),
            serve_args=tuple(shlex.split(args.serve_args)),
            api_key=args.api_key,
            server_timeout=args.server_timeout,
            progress=not args.no_progress,
            device=_device(),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the server context managers, which stop every server


def run(args: argparse.Namespace) -> int:
    """Run every variant, print the table, write the JSON when asked."""
    from paged_bench.serve_bench import run_serve_bench
    from paged_bench.serve_report import print_serve_summary, validate_serve_report

    opts = options_from(args)
    argv = ["paged", *sys.argv[1:]] if sys.argv[0].endswith("paged") else None
    if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            report = run_serve_bench(opts, argv=argv)
        finally:
            signal.signal(signal.SIGTERM, previous)
    else:
        report = run_serve_bench(opts, argv=argv)
    problems = validate_serve_report(report)
    if problems:  # a bug in the bench itself: say so, but still write what was measured
        print(
            "paged bench serve: warning: report does not match its schema: " + "; ".join(problems[:5]), file=sys.stderr
        )
    print_serve_summary(report)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        print(f"wrote {args.json_path}", file=sys.stderr)
    failed = sum(r["failed"] for r in report["runs"])
    return 1 if problems or failed else 0
