"""Kernel benchmark for paged-backend-cpu (a script, not a test).

At the embedded model's attention shape (head size 64, 9 query heads, 3 KV
heads), bf16, a decode batch of 32 rows at contexts of 1k and 4k tokens, it
times one attention call of

* the cpu backend over a paged cache (blocks shuffled, as after churn),
* the reference backend over the same cache,
* ``torch.nn.functional.scaled_dot_product_attention`` on the same keys and
  values stored contiguously (the cost of paging is the ratio to this),

and compares the cpu backend's effective KV-read bandwidth with the machine's
copy bandwidth measured in the same run (a large tensor copy, read + write
bytes per second). Timings on shared machines drift: read the ratios.

``--kv-dtypes`` times the same step over caches of other KV dtypes (int8 and
float8 caches hold the quantized keys and values, each vector with its scale;
SDPA and the reference then read the dequantized values), one after the other
in each round so that drift hits them alike; ``--window`` and ``--soft-cap``
give the layer a sliding window and a logits soft cap.

    python backends/cpu/benchmarks/kernel_bench.py [--block-size 16] [--contexts 1024 4096] [--repeat 30]
        [--kv-dtypes bfloat16 int8 float8_e4m3fn float8_e5m2] [--window 0] [--soft-cap 0]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from paged_backend_cpu import CpuBackend, layout, ops
from paged_core.api import AttentionSpec, build_attention_metadata, dequantize_kv, is_quantized_kv, quantize_kv
from paged_core.testing import ReferenceBackend

HEADS, KV_HEADS, HEAD_SIZE, BATCH = 9, 3, 64, 32


def timed(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Best (minimum) seconds of ``fn`` over ``repeat`` calls after ``warmup`` calls.

    The minimum, not the median: on a shared machine other processes only ever add time,
    and every figure below (copy included) is taken the same way.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples)


def copy_bandwidth(mbytes: int, repeat: int) -> float:
    """Bytes per second moved (read + written) by copying a ``mbytes`` MB tensor with torch's threads."""
    src = torch.ones(mbytes * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() / seconds


def bench_context(
    context: int,
    block_size: int,
    repeat: int,
    with_reference: bool,
    kv_dtypes: list[torch.dtype],
    window: int,
    soft_cap: float,
) -> dict[str, dict[str, float]]:
    """Times for one decode step of BATCH rows, each with ``context`` tokens in the cache, per KV dtype."""
    gen = torch.Generator().manual_seed(context)
    spec = AttentionSpec(HEADS, KV_HEADS, HEAD_SIZE, sliding_window=window or None, logits_soft_cap=soft_cap or None)
    per_row = -(-context // block_size)
    num_blocks = BATCH * per_row + 1
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).view(BATCH, per_row)
    md = build_attention_metadata([1] * BATCH, [context] * BATCH, ids.tolist(), block_size)
    cpu = CpuBackend("cpu")
    # Random keys and values in the core's default layout, for SDPA and the reference backend.
    randn = torch.randn(2, num_blocks, block_size, KV_HEADS, HEAD_SIZE, generator=gen)
    # A [1, H, T, D] projection viewed as [T, H, D], as the engine hands queries over.
    query = torch.randn(1, HEADS, BATCH, HEAD_SIZE, generator=gen).to(torch.bfloat16).transpose(1, 2)[0]
    q4 = query.reshape(BATCH, HEADS, 1, HEAD_SIZE)
    lo = max(0, context - window) if window else 0
    runs: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    out: dict[str, dict[str, float]] = {}
    for kv_dtype in kv_dtypes:
        name = str(kv_dtype).removeprefix("torch.")
        if is_quantized_kv(kv_dtype):
            stored = quantize_kv(randn, kv_dtype)
            standard = dequantize_kv(stored, torch.bfloat16)
        else:
            stored = standard = randn.to(kv_dtype)
        cache = cpu.allocate_kv_cache(num_blocks, block_size, spec, kv_dtype)
        cache.copy_(layout.from_standard(stored))
        # The same keys/values, contiguous per row: [B, KVH, context, D] (only the window's, with a window).
        keys = standard[0][ids].reshape(BATCH, per_row * block_size, KV_HEADS, HEAD_SIZE)[:, lo:context]
        values = standard[1][ids].reshape(BATCH, per_row * block_size, KV_HEADS, HEAD_SIZE)[:, lo:context]
        keys, values = keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()
        runs[name] = (cache, standard, keys, values)
        paged = cpu.attention(query, cache, md, spec)
        dense = F.scaled_dot_product_attention(q4, keys, values, enable_gqa=True).reshape(BATCH, HEADS, HEAD_SIZE)
        cache_bytes = cache.element_size() * cache[:, 0].numel() * per_row * BATCH * (context - lo) / context
        out[name] = {"max_abs_diff": float((paged.float() - dense.float()).abs().max()), "kv_bytes": cache_bytes}
    # Rounds of every KV dtype in turn, each keeping its best time.
    for _ in range(3):
        for name, (cache, _, keys, values) in runs.items():
            best = timed(lambda c=cache: cpu.attention(query, c, md, spec), max(1, repeat // 3))
            out[name]["cpu"] = min(out[name].get("cpu", best), best)
            if "sdpa" not in out[name] and spec.logits_soft_cap is None:
                out[name]["sdpa"] = timed(
                    lambda k=keys, v=values: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True), repeat
                )
    if with_reference:
        ref = ReferenceBackend("cpu")
        for name, (_, standard, _, _) in runs.items():
            out[name]["reference"] = timed(lambda s=standard: ref.attention(query, s, md, spec), 3, warmup=1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=CpuBackend.capabilities().block_sizes[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--kv-dtypes", nargs="+", default=["bfloat16"], help="KV-cache dtypes, by torch name")
    parser.add_argument("--window", type=int, default=0, help="sliding window (0: none)")
    parser.add_argument("--soft-cap", type=float, default=0.0, help="logits soft cap (0: none)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference backend")
    args = parser.parse_args()
    torch.manual_seed(0)
    kv_dtypes = [getattr(torch, name) for name in args.kv_dtypes]
    print(
        f"paged-backend-cpu kernel benchmark: kernels {ops.isa()}, {torch.get_num_threads()} threads, "
        f"bf16 queries, batch {BATCH}, heads {HEADS}/{KV_HEADS}, head size {HEAD_SIZE}, block size {args.block_size}"
        f", window {args.window or 'none'}, soft cap {args.soft_cap or 'none'}"
    )
    copy_bw = copy_bandwidth(256, max(5, args.repeat // 3))
    print(f"copy bandwidth (256 MB tensor copy, read + write): {copy_bw / 1e9:.1f} GB/s")
    for context in args.contexts:
        results = bench_context(
            context, args.block_size, args.repeat, not args.no_reference, kv_dtypes, args.window, args.soft_cap
        )
        first = next(iter(results.values()))
        for name, r in results.items():
            bw = r["kv_bytes"] / r["cpu"]
            line = f"context {context:5d} {name:>13}: cpu {r['cpu'] * 1e3:7.3f} ms"
            if len(results) > 1:
                line += f" ({r['cpu'] / first['cpu']:.2f}x the first)"
            if "sdpa" in r:
                line += f" | sdpa (contiguous) {r['sdpa'] * 1e3:7.3f} ms -> cpu/sdpa {r['cpu'] / r['sdpa']:.2f}x"
            line += (
                f" | KV read {bw / 1e9:.1f} GB/s = {100 * bw / copy_bw:.0f}% of copy"
                f" | max |cpu - sdpa| {r['max_abs_diff']:.1e}"
            )
            if "reference" in r:
                line += f" | reference {r['reference'] * 1e3:.1f} ms ({r['reference'] / r['cpu']:.0f}x cpu)"
            print(line)


if __name__ == "__main__":
    main()
