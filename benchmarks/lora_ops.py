"""Multi-LoRA products on the CPU: the cpu backend's ``lora_shrink`` / ``lora_expand`` against the contract's reference.

``K`` = 576 inputs (SmolLM2-135M's hidden size) and ``N`` = 1,728 outputs, ``S`` = 4 resident adapters, ``R`` = 48
(three parts of rank 16 stacked), at ``T`` = 1, 16, 256 and 2,048 tokens, fp32 and bf16 (x, y and the adapters in
one dtype). Two slot patterns: ``scattered`` (each token's slot drawn from -1..3, as decode rows of requests on
different adapters) and ``runs`` (five contiguous groups, one per adapter and one without, in random order and
sizes, as prefill chunks of requests). Every result is first compared with the reference. Prints the median time
per call (microseconds) of each and the speedup.

Not a test: the machine may be shared; read the figures with their spread. Figures: backends/cpu/README.md,
"Multi-LoRA".

    .venv/bin/python benchmarks/lora_ops.py [--tokens 1,16,256,2048] [--reps 30] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from paged_backend_cpu.fused import CpuFusedOps
from paged_core.api import FusedOps

S, R, K, N = 4, 48, 576, 1728


def slots_for(pattern: str, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """``[T]`` int64 slots in -1..S-1: drawn per token, or as contiguous groups (one per slot and -1)."""
    if pattern == "scattered" or tokens < S + 1:
        return torch.randint(-1, S, (tokens,), generator=gen)
    cuts = sorted(torch.randperm(tokens - 1, generator=gen)[:S].add(1).tolist())
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]
    order = torch.randperm(S + 1, generator=gen).sub(1).tolist()
    return torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in zip(order, sizes, strict=True)])


def median_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def time_case(
    x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, reps: int
) -> list[float]:
    """Check the cpu ops against the reference once, then the median us of (ref shrink, cpu shrink, ref expand,
    cpu expand)."""
    ref, cpu = FusedOps(), CpuFusedOps()
    want = ref.lora_shrink(x, a, slots)
    torch.testing.assert_close(cpu.lora_shrink(x, a, slots), want, rtol=2e-4, atol=2e-4)
    tol = 2e-4 if x.dtype == torch.float32 else 3e-2
    got_y, want_y = cpu.lora_expand(y.clone(), want, b, slots), ref.lora_expand(y.clone(), want, b, slots)
    torch.testing.assert_close(got_y, want_y, rtol=tol, atol=tol)
    ys = y.clone()  # expand adds in place: timing it on one buffer changes the values, not the work
    return [
        median_us(lambda: ref.lora_shrink(x, a, slots), reps),
        median_us(lambda: cpu.lora_shrink(x, a, slots), reps),
        median_us(lambda: ref.lora_expand(ys, want, b, slots), reps),
        median_us(lambda: cpu.lora_expand(ys, want, b, slots), reps),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,16,256,2048")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"S={S} R={R} K={K} N={N}, {torch.get_num_threads()} threads; median us per call (reference / cpu = x)")
    head = ("dtype", "T", "slots", "shrink ref", "cpu", "x", "expand ref", "cpu", "x")
    print("{:9} {:>5} {:9} {:>11} {:>8} {:>6} {:>11} {:>8} {:>6}".format(*head))
    for dtype in (torch.float32, torch.bfloat16):
        a = (torch.randn(S, R, K, generator=gen) / K**0.5).to(dtype)
        b = (torch.randn(S, N, R, generator=gen) / R**0.5).to(dtype)
        for tokens in (int(t) for t in args.tokens.split(",")):
            for pattern in ("scattered", "runs") if tokens > 1 else ("scattered",):
                x = torch.randn(tokens, K, generator=gen).to(dtype)
                y = torch.randn(tokens, N, generator=gen).to(dtype)
                reps = max(3, args.reps // 4) if tokens >= 2048 else args.reps
                t = time_case(x, y, a, b, slots_for(pattern, tokens, gen), reps)
                name = str(dtype).removeprefix("torch.")
                print(
                    f"{name:9} {tokens:>5} {pattern:9} {t[0]:>11.0f} {t[1]:>8.0f} {t[0] / t[1]:>5.1f}x"
                    f" {t[2]:>11.0f} {t[3]:>8.0f} {t[2] / t[3]:>5.1f}x"
                )


if __name__ == "__main__":
    main()
