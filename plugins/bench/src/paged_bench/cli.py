"""``paged bench WORKLOAD``: the fixed, seeded workloads against transformers and the reference backend.

Examples::

    paged bench throughput --baseline hf-static,hf-cb --json out.json --plot out.png
    paged bench throughput --num-requests 64 --constrained
    paged bench throughput --num-requests 64 --lora 4
    paged bench kv-util --plot kv.png
    paged bench kv-util --kv-cache-dtype bfloat16 --kv-dtypes fp8_e4m3,int8
    paged bench throughput --num-requests 64 --kv-dtypes auto,bfloat16,fp8_e4m3,int8
    paged bench prefix --num-requests 16 --json prefix.json
    paged bench serve --servers mp,inproc --concurrency 32 --json serve.json

paged-core's ``paged`` command finds this module through ``paged_core.cli.bench`` (its one import of
paged_bench); ``EXTRA`` below is what ``paged`` checks before :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from paged_bench.serve_cli import add_serve_bench_args
from paged_core.cli.engine_args import add_engine_args
from paged_core.config import ModelConfig
from paged_core.errors import ConfigError
from paged_core.process.logs import setup_logging

WORKLOAD_NAMES = ("throughput", "prefix", "kv-util", "decode-1", "edit-1", "long", "serve")
"""The workloads, and ``serve``: the ``throughput`` requests streamed to ``paged serve`` (see ``serve_cli``)."""
DEFAULT_KV_CACHE = "4GiB"
"""Enough for every workload on the default model (``long`` holds 8 x 4k tokens), and fixed so runs compare."""


EXTRA = "bench"
"""The optional part of paged-core this subcommand needs (``paged-core[bench]``)."""


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark a seeded workload against transformers (and the reference backend)",
        description=(
            "Run one of the fixed workloads on our engine and the chosen baselines in the same process, "
            "then print a table; --json writes every figure, the machine and the configuration. "
            f"Engine options default as for `paged generate` (what a user starts with no flags), except "
            f"--kv-cache-memory, fixed at {DEFAULT_KV_CACHE}."
        ),
    )
    parser.add_argument(
        "workload",
        choices=WORKLOAD_NAMES,
        help="which workload (see the bench README); serve: the throughput requests streamed by "
        "concurrent clients to `paged serve` variants it starts (or to --url)",
    )
    parser.add_argument(
        "--baseline",
        default="",
        metavar="LIST",
        help="comma-separated: hf-static, hf-cb, reference, dequantized, eager, no-pieces (same process), vllm, "
        "vllm-compiled (vLLM's CPU build in its own environment: bash benchmarks/vllm_env.sh), "
        "llama.cpp (decode-1 on a GGUF: bash benchmarks/llama_cpp_env.sh)",
    )
    parser.add_argument("--num-requests", type=int, default=None, help="run only the first N requests")
    parser.add_argument(
        "--output-len", "--max-tokens", type=int, default=None, help="cap every request's output tokens (quick runs)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (0: the published figures)")
    parser.add_argument("--hf-batch", type=int, default=32, help="static batch size of the hf-static baseline")
    parser.add_argument("--kv-tokens", type=int, default=32768, help="kv-util: KV budget in token slots")
    parser.add_argument(
        "--layer-windows",
        default=None,
        metavar="LIST",
        help="kv-util: a sliding model, each layer's window or 'full' (e.g. 1024,1024,full); adds the same "
        "requests with full-attention accounting on the same bytes",
    )
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write the report as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the workload's figure")
    parser.add_argument(
        "--constrained",
        action="store_true",
        help="throughput: also run every request with a JSON schema (8 bounded schemas) on the same engine, "
        "and report constrained against unconstrained output tok/s, mask time per step and compile p50/p99",
    )
    parser.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="N",
        help="also run the requests spread round-robin over N random LoRA adapters (all seven projections, "
        "written to a temporary directory) on an engine with enable_lora and the same weights, beside the base "
        "model; --max-loras defaults to max(4, N) here",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=16, metavar="R", help="rank of the --lora adapters (default 16)"
    )
    parser.add_argument(
        "--kv-dtypes",
        default="",
        metavar="LIST",
        help="throughput and kv-util: also run with the KV cache in each of these dtypes (e.g. "
        "auto,bfloat16,fp8_e4m3,int8), beside --kv-cache-dtype: output tok/s and the NLL of a fixed text vs auto "
        "(throughput), peak concurrent requests on one byte budget vs bfloat16 (kv-util)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine set-up")
    add_engine_args(parser)
    add_serve_bench_args(parser)
    # Ours runs as a user starts it (dtype auto: bf16 where the CPU has bf16 dot products, else fp32; the
    # report records which); the KV budget is fixed so figures compare across runs and machines.
    parser.set_defaults(func=run, kv_cache_memory=DEFAULT_KV_CACHE)
    # The engine's defaults, marked as not given, so --lora can raise them to fit its adapters (see lora_limits).
    defaults = ModelConfig()
    parser.set_defaults(max_loras=NotGiven(defaults.max_loras), max_lora_rank=NotGiven(defaults.max_lora_rank))


class NotGiven(int):
    """An option's default, told apart from the same value given on the command line."""


def options_from(args: argparse.Namespace) -> Any:
    """:class:`~paged_bench.options.BenchOptions` from parsed arguments (errors name the option)."""
    from paged_bench.kv_dtypes import parse_kv_dtypes
    from paged_bench.kv_util import KVUtilConfig
    from paged_bench.options import BenchOptions, parse_baselines
    from paged_core.cli.engine_args import engine_config_from

    try:
        config = engine_config_from(args, **lora_limits(args))
        sched = config.scheduler
        kv = KVUtilConfig(
            kv_tokens=args.kv_tokens,
            block_size=config.cache.block_size or 16,
            max_len=sched.max_model_len or 2048,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_seqs=sched.max_num_seqs,
            layer_windows=layer_windows(args.layer_windows),
        )
        return BenchOptions(
            workload=args.workload,
            baselines=parse_baselines(args.baseline),
            num_requests=args.num_requests,
            output_len=args.output_len,
            seed=args.seed,
            hf_batch=args.hf_batch,
            engine=config.to_flat(),
            kv_util=kv,
            progress=not args.no_progress,
            constrained=args.constrained,
            lora=args.lora,
            lora_rank=args.lora_rank,
            kv_dtypes=parse_kv_dtypes(args.kv_dtypes),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def lora_limits(args: argparse.Namespace) -> dict[str, int]:
    """``max_loras`` and ``max_lora_rank`` where not given: the engine's defaults, raised to fit ``--lora N``
    (N adapters resident at once, of rank ``--lora-rank``)."""
    out: dict[str, int] = {"max_loras": int(args.max_loras), "max_lora_rank": int(args.max_lora_rank)}
    if isinstance(args.max_loras, NotGiven):
        out["max_loras"] = max(out["max_loras"], args.lora or 0)
    if isinstance(args.max_lora_rank, NotGiven):
        out["max_lora_rank"] = max(out["max_lora_rank"], args.lora_rank if args.lora else 0)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the tables, write the JSON and the plot when asked."""
    from paged_bench.plot import write_plot
    from paged_bench.run import run_bench
    from paged_bench.schema import validate_report
    from paged_bench.table import print_summary

    setup_logging(args.verbose)
    if args.workload == "serve":
        from paged_bench import serve_cli

        ignored = (("--baseline", args.baseline), ("--plot", args.plot), ("--lora", args.lora))
        for flag, given in (*ignored, ("--kv-dtypes", args.kv_dtypes)):
            if given:
                print(f"paged bench serve: {flag} does not apply here, ignored", file=sys.stderr)
        return serve_cli.run(args)
    opts = options_from(args)
    report = run_bench(opts, argv=["paged", *sys.argv[1:]] if sys.argv[0].endswith("paged") else None)
    problems = validate_report(report)
    if problems:  # a bug in the bench itself: say so, but still write what was measured
        print("paged bench: warning: report does not match its schema: " + "; ".join(problems[:5]), file=sys.stderr)
    print_summary(report)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plot:
        print(f"wrote {write_plot(report, args.plot)}", file=sys.stderr)
    return 1 if problems else 0


def layer_windows(text: str | None) -> tuple[int | None, ...]:
    """``--layer-windows``: comma-separated windows or ``full``; refuses anything else naming it."""
    if not text:
        return ()
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "full":
            out.append(None)
        elif part.isdigit() and int(part) > 0:
            out.append(int(part))
        else:
            raise ValueError(f"--layer-windows: {part!r} is neither a window (an int >= 1) nor 'full'")
    return tuple(out)
