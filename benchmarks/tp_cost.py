"""What tensor parallelism costs and buys on this machine: tokens/s at tensor parallel 1 and N, one invocation.

    .venv/bin/python benchmarks/tp_cost.py [--model PATH] [--tp 3] [--json out.json]

Default model: the embedded SmolLM2-135M (9 heads, 3 KV heads, so N = 3). Two workloads, each
run at tensor parallel 1 and then N with the same engine options: ``decode-1`` (one stream,
64 prompt tokens, 128 output tokens) and ``batch-16`` (16 streams of 64 prompt and 64 output
tokens). Greedy, ``ignore_eos``, the engine as a user starts it (best backend, dtype auto) with a
256 MiB KV budget per rank. Prints tokens/s, ms per step and the ratio N/1. Local ranks share this
machine's cores (each gets cores / N threads).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from paged_core import LLM, SamplingParams


def _workloads() -> dict[str, tuple[list[list[int]], SamplingParams]]:
    one = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    batch = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompt = [(17 * j) % 4000 + 100 for j in range(64)]
    return {"decode-1": ([prompt], one), "batch-16": ([[t + i for t in prompt] for i in range(16)], batch)}


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    steps0 = llm.engine.core.stats().steps
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    took = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    steps = llm.engine.core.stats().steps - steps0
    return {"tokens": tokens, "seconds": took, "tok_per_s": tokens / took, "ms_per_step": 1000 * took / max(steps, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="local model (default: the embedded SmolLM2)")
    parser.add_argument("--tp", type=int, default=3, help="the tensor-parallel size to compare with 1")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    engine = {"kv_cache_memory": "256MiB", "distributed_timeout": 300.0}
    report: dict[str, dict[str, dict[str, float]]] = {}
    for size in (1, args.tp):
        with LLM(args.model, tensor_parallel_size=size, **engine) as llm:
            for name, (prompts, params) in _workloads().items():
                report.setdefault(name, {})[f"tp{size}"] = _run(llm, prompts, params)
    print(
        f"{'workload':10} {'tp1 tok/s':>10} {f'tp{args.tp} tok/s':>10} {'ratio':>6} {'tp1 ms/step':>12} "
        f"{f'tp{args.tp} ms/step':>12}"
    )
    for name, row in report.items():
        a, b = row["tp1"], row[f"tp{args.tp}"]
        print(
            f"{name:10} {a['tok_per_s']:10.1f} {b['tok_per_s']:10.1f} {b['tok_per_s'] / a['tok_per_s']:6.2f} "
            f"{a['ms_per_step']:12.1f} {b['ms_per_step']:12.1f}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "model": args.model or "embedded SmolLM2-135M",
                    "tp": args.tp,
                    "cores": os.cpu_count(),
                    "engine": engine,
                    "results": report,
                },
                fh,
                indent=2,
            )


if __name__ == "__main__":
    main()
