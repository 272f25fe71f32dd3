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

    python backends/cpu/benchmarks/kernel_bench.py [--block-size 16] [--contexts 1024 4096] [--repeat 30]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from paged_backend_cpu import CpuBackend, layout, ops
from paged_core.api import AttentionSpec, build_attention_metadata
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


def bench_context(context: int, block_size: int, repeat: int, with_reference: bool) -> dict[str, float]:
    """Times for one decode step of BATCH rows, each with ``context`` tokens in the cache."""
    gen = torch.Generator().manual_seed(context)
    spec = AttentionSpec(HEADS, KV_HEADS, HEAD_SIZE)
    per_row = -(-context // block_size)
    num_blocks = BATCH * per_row + 1
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).view(BATCH, per_row)
    md = build_attention_metadata([1] * BATCH, [context] * BATCH, ids.tolist(), block_size)
    cpu = CpuBackend("cpu")
    # Random keys and values in the core's default layout, for SDPA and the reference backend.
    standard = torch.randn(2, num_blocks, block_size, KV_HEADS, HEAD_SIZE, generator=gen).to(torch.bfloat16)
    cache = cpu.allocate_kv_cache(num_blocks, block_size, spec, torch.bfloat16)
    cache.copy_(layout.from_standard(standard))
    # A [1, H, T, D] projection viewed as [T, H, D], as the engine hands queries over.
    query = torch.randn(1, HEADS, BATCH, HEAD_SIZE, generator=gen).to(torch.bfloat16).transpose(1, 2)[0]
    # The same keys/values, contiguous per row: [B, KVH, context, D].
    keys = standard[0][ids].reshape(BATCH, per_row * block_size, KV_HEADS, HEAD_SIZE)[:, :context].transpose(1, 2)
    values = standard[1][ids].reshape(BATCH, per_row * block_size, KV_HEADS, HEAD_SIZE)[:, :context].transpose(1, 2)
    keys, values = keys.contiguous(), values.contiguous()
    q4 = query.reshape(BATCH, HEADS, 1, HEAD_SIZE)
    paged = cpu.attention(query, cache, md, spec)
    dense = F.scaled_dot_product_attention(q4, keys, values, enable_gqa=True).reshape(BATCH, HEADS, HEAD_SIZE)
    err = float((paged.float() - dense.float()).abs().max())
    out = {
        "cpu": timed(lambda: cpu.attention(query, cache, md, spec), repeat),
        "sdpa": timed(lambda: F.scaled_dot_product_attention(q4, keys, values, enable_gqa=True), repeat),
        "max_abs_diff": err,
        "kv_bytes": 2.0 * keys.numel() * keys.element_size(),
    }
    if with_reference:
        ref = ReferenceBackend("cpu")
        out["reference"] = timed(lambda: ref.attention(query, standard, md, spec), 3, warmup=1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=CpuBackend.capabilities().block_sizes[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference backend")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"paged-backend-cpu kernel benchmark: kernels {ops.isa()}, {torch.get_num_threads()} threads, "
        f"bf16, batch {BATCH}, heads {HEADS}/{KV_HEADS}, head size {HEAD_SIZE}, block size {args.block_size}"
    )
    copy_bw = copy_bandwidth(256, max(5, args.repeat // 3))
    print(f"copy bandwidth (256 MB tensor copy, read + write): {copy_bw / 1e9:.1f} GB/s")
    for context in args.contexts:
        r = bench_context(context, args.block_size, args.repeat, not args.no_reference)
        bw = r["kv_bytes"] / r["cpu"]
        line = (
            f"context {context:5d}: cpu {r['cpu'] * 1e3:7.3f} ms | sdpa (contiguous) {r['sdpa'] * 1e3:7.3f} ms"
            f" -> cpu/sdpa {r['cpu'] / r['sdpa']:.2f}x | KV read {bw / 1e9:.1f} GB/s = "
            f"{100 * bw / copy_bw:.0f}% of copy | max |cpu - sdpa| {r['max_abs_diff']:.1e}"
        )
        if "reference" in r:
            line += f" | reference {r['reference'] * 1e3:.1f} ms ({r['reference'] / r['cpu']:.0f}x cpu)"
        print(line)


if __name__ == "__main__":
    main()
