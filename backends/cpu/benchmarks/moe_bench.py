"""Routed-experts benchmark for paged-backend-cpu (a script, not a test).

A Qwen3-MoE-like layer (hidden 1024, intermediate 768 per expert, 64 experts, top-8, softmax routing without
renormalising) with packed experts, at T tokens: one call of

* ``cpu``: ``CpuFusedOps.moe`` (routing in torch, then ``paged_cpu::moe``: tokens grouped by expert, each expert's
  rows through the packed linear's kernels, csrc/moe_ops.cpp);
* ``reference``: ``paged_core.api.FusedOps().moe`` on the same experts (each chosen expert dequantized in fp32,
  torch's matmul), what the engine runs without the override;

and the bytes of the experts the call reads (the distinct experts its tokens chose, gate_up and down), per call and
per token, read per second against the machine's read bandwidth (a 256 MB tensor summed) and copy bandwidth (a
256 MB tensor copied, read + write bytes) measured in the same run. Experts are cold: each call uses the next of
enough copies of the layer to fill ``--cold-mb`` and fresh router logits, as a model's layers follow each other.

Figures are medians (and minima) of ``--repeat`` calls per cell after 10 warmup calls, threads set by
``torch.set_num_threads``: on a shared machine, read the ratios.

    python backends/cpu/benchmarks/moe_bench.py [--formats q4_0 q8_0] [--tokens 1 8 64] [--threads 1 2]
        [--repeat 30] [--cold-mb 256] [--no-reference] [--no-interleave]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

from paged_backend_cpu import CpuFusedOps, ops
from paged_core.api import LINEAR_FORMATS, FusedOps, MoERouting, PackedExperts, QuantizedWeight, route_experts
from paged_core.testing import random_packed

HIDDEN, INTER, EXPERTS, TOP_K = 1024, 768, 64, 8


def times(fn: Callable[[int], object], repeat: int, warmup: int = 10) -> list[float]:
    """Seconds of ``fn(i)`` for ``i`` in ``0 .. repeat - 1`` after ``warmup`` calls.

    The warmup also wakes every thread: on the 2-vCPU development VM the first calls after a pause took whole
    scheduler ticks (4-20 ms) at two threads, the reference's as well, until both vCPUs were busy."""
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(repeat):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def read_bandwidth(mbytes: int, repeat: int) -> float:
    """Bytes per second read by summing a ``mbytes`` MB float32 tensor with torch's threads."""
    src = torch.ones(mbytes * 2**20 // 4)
    return 4 * src.numel() / min(times(lambda _: src.sum(), repeat))


def copy_bandwidth(mbytes: int, repeat: int) -> float:
    """Bytes per second moved (read + written) copying a ``mbytes`` MB tensor with torch's threads."""
    src = torch.ones(mbytes * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / min(times(lambda _: dst.copy_(src), repeat))


def copy_of(w: QuantizedWeight) -> QuantizedWeight:
    """``w`` in memory of its own."""
    scale = None if w.scale is None else w.scale.clone()
    return QuantizedWeight(w.format, w.shape, w.data.clone(), scale, w.name)


def expert_bytes(experts: PackedExperts) -> int:
    """Packed bytes of one expert (gate_up and down rows)."""
    total = 0
    for w, rows in ((experts.gate_up, 2 * INTER), (experts.down, HIDDEN)):
        assert not isinstance(w, torch.Tensor)
        total += rows * w.data.shape[1]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["q4_0", "q8_0"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--cold-mb", type=int, default=256, help="expert bytes cycled through (above the L3)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference")
    parser.add_argument("--no-interleave", action="store_true", help="q4 experts without the interleaved copy")
    args = parser.parse_args()
    cpu, ref = CpuFusedOps(interleave=not args.no_interleave), FusedOps()
    routing = MoERouting(EXPERTS, TOP_K, renormalize=False)
    gen = torch.Generator().manual_seed(0)
    print(
        f"paged-backend-cpu moe benchmark: H={HIDDEN} I={INTER} E={EXPERTS} top-{TOP_K}, fp32 x, q8 kernels "
        f"{ops.quant_q8_isa()}, activations {ops.linear_activations()}, interleaved q4 {not args.no_interleave}"
    )
    for fmt in args.formats:
        gate_up = random_packed(LINEAR_FORMATS[fmt], EXPERTS * 2 * INTER, HIDDEN, gen, scale=HIDDEN**-0.5)
        down = random_packed(LINEAR_FORMATS[fmt], EXPERTS * HIDDEN, INTER, gen, scale=INTER**-0.5)
        per_expert = expert_bytes(PackedExperts(gate_up, down))
        copies = max(1, -(-args.cold_mb * 2**20 // (per_expert * EXPERTS)))
        layers = [cpu.pack_experts(copy_of(gate_up), copy_of(down)) for _ in range(copies)]
        refs = [PackedExperts(w.gate_up, w.down) for w in layers]
        print(f"\n{fmt}: {per_expert / 2**20:.2f} MB per expert, {copies} copies of the layer cycled")
        for threads in args.threads:
            torch.set_num_threads(threads)
            read_bw, copy_bw = read_bandwidth(256, 5), copy_bandwidth(256, 5)
            print(
                f"  {threads} thread(s): read {read_bw / 1e9:.1f} GB/s, copy {copy_bw / 1e9:.1f} GB/s "
                "(256 MB tensor sum / copy)"
            )
            for tokens in args.tokens:
                xs = [torch.randn(tokens, HIDDEN, generator=gen) for _ in range(7)]
                logits = [torch.randn(tokens, EXPERTS, generator=gen) for _ in range(11)]
                active = statistics.mean(int(torch.unique(route_experts(lg, routing)[1]).numel()) for lg in logits)
                read = active * per_expert

                def call(
                    i: int,
                    packs: list[PackedExperts],
                    fused: FusedOps,
                    xs: list[torch.Tensor],
                    logits: list[torch.Tensor],
                ) -> object:
                    return fused.moe(xs[i % len(xs)], logits[i % len(logits)], packs[i % len(packs)], routing)

                mine = times(functools.partial(call, packs=layers, fused=cpu, xs=xs, logits=logits), args.repeat)
                med, best = statistics.median(mine), min(mine)
                line = (
                    f"    T={tokens:3d}: cpu {med * 1e3:7.3f} ms (min {best * 1e3:.3f}) | {active:4.1f} experts, "
                    f"{read / 2**20:6.1f} MB read, {read / tokens / 2**20:6.2f} MB/token | "
                    f"{read / med / 1e9:5.1f} GB/s = {100 * read / med / read_bw:3.0f}% of read bandwidth"
                )
                if not args.no_reference:
                    reference = functools.partial(call, packs=refs, fused=ref, xs=xs, logits=logits)
                    theirs = statistics.median(times(reference, 3, warmup=1))
                    line += f" | reference {theirs * 1e3:8.2f} ms ({theirs / med:5.1f}x cpu)"
                print(line)


if __name__ == "__main__":
    main()
