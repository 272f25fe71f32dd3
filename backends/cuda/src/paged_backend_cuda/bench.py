"""Decode timing on an NVIDIA GPU, as a share of the GPU's copy bandwidth and against FlashInfer.

``python -m paged_backend_cuda.bench --out FILE`` times one decode attention call (the keys already written)
for each batch size and context length (head size 128, 32 query heads over 8 KV heads, bf16, blocks of 16,
shuffled block tables) with each named backend, in a CUDA graph of 20 calls so launch overhead does not
count. Bandwidth counts the keys and values read once: ``batch * context * kv_heads * head * 2 * 2`` bytes.
The copy bandwidth is a 4 GiB device-to-device copy (read + write bytes over its time).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from paged_core.api import AttentionMetadata, AttentionSpec
from paged_core.testing import load_registry

CALLS = 20


def _metadata(batch: int, context: int, block: int, device: torch.device) -> tuple[AttentionMetadata, int]:
    per_row = -(-context // block)
    table = (torch.randperm(batch * per_row, device=device).to(torch.int32) + 1).view(batch, per_row)  # 0: null
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    seq = torch.full((batch,), context, dtype=torch.int32)
    md = AttentionMetadata(
        query_start_loc=qsl.to(device),
        seq_lens=seq.to(device),
        block_table=table,
        slot_mapping=torch.full((batch,), -1, dtype=torch.int64, device=device),
        block_size=block,
        num_decodes=batch,
        num_decode_tokens=batch,
        num_prefills=0,
        num_actual_tokens=batch,
        max_query_len=1,
        max_seq_len=context,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq,
        uniform_query_len=1,
    )
    return md, batch * per_row + 1


def _graph_ms(fn: Callable[[], Any]) -> float:
    """Milliseconds per call of ``fn``, replayed as a CUDA graph of ``CALLS`` calls (after a warm-up)."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / (5 * CALLS)


def copy_bandwidth(gib: int = 4) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _graph_ms(lambda: dst.copy_(src))
    return 2 * (gib << 30) / ms / 1e6


def time_decode(
    name: str, batch: int, context: int, heads: int = 32, kv_heads: int = 8, head: int = 128, block: int = 16
) -> dict[str, Any]:
    """One backend, one case: milliseconds per decode attention call and the bandwidth it reaches."""
    device = torch.device("cuda")
    backend = load_registry().select(name)(device)
    spec = AttentionSpec(heads, kv_heads, head)
    md, num_blocks = _metadata(batch, context, block, device)
    cache = torch.randn(backend.kv_cache_shape(num_blocks, block, kv_heads, head), dtype=torch.bfloat16, device=device)
    query = torch.randn(batch, heads, head, dtype=torch.bfloat16, device=device)
    backend.prepare(md)
    backend.attention(query, cache, md, spec)  # eager first: plans, loads, learns the configuration
    ms = _graph_ms(lambda: backend.attention(query, cache, md, spec))
    read = batch * context * kv_heads * head * 2 * 2
    return {
        "backend": name,
        "batch": batch,
        "context": context,
        "ms": ms,
        "gb_per_s": read / ms / 1e6,
        "kv_bytes": read,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid for each backend, print one line per case, write JSON to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m paged_backend_cuda.bench", description=__doc__)
    parser.add_argument("--out", default=None, help="write results as JSON here")
    parser.add_argument("--backends", default="cuda,cuda-flashinfer", help="backends to time (unavailable: noted)")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--contexts", default="1024,8192")
    ns = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    copy = copy_bandwidth()
    print(f"copy bandwidth: {copy:.0f} GB/s (read + write)")
    torch.cuda.empty_cache()
    rows: list[dict[str, Any]] = []
    skipped = {}
    for name in ns.backends.split(","):
        for batch in (int(b) for b in ns.batches.split(",")):
            for context in (int(c) for c in ns.contexts.split(",")):
                try:
                    row = time_decode(name, batch, context)
                except Exception as exc:  # one backend's failure is one line, not the end of the run
                    skipped[name] = f"{type(exc).__name__}: {exc}"
                    print(f"{name}: not timed ({skipped[name][:200]})")
                    break
                row["share_of_copy"] = row["gb_per_s"] / copy
                rows.append(row)
                torch.cuda.empty_cache()  # the previous case's cache (up to 8.6 GB) before the next
                print(
                    f"{name:16s} batch {batch:4d} context {context:5d}: {row['ms']:.3f} ms, "
                    f"{row['gb_per_s']:.0f} GB/s, {100 * row['share_of_copy']:.0f}% of copy"
                )
            if name in skipped:
                break
    ours = {(r["batch"], r["context"]): r["ms"] for r in rows if r["backend"] == "cuda"}
    for r in rows:
        if r["backend"] == "cuda-flashinfer" and (r["batch"], r["context"]) in ours:
            ratio = r["ms"] / ours[(r["batch"], r["context"])]
            print(f"batch {r['batch']} context {r['context']}: cuda is {ratio:.2f}x FlashInfer's speed")
    if ns.out:
        with open(ns.out, "w") as fh:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "copy_gb_per_s": copy,
                    "results": rows,
                    "not_timed": skipped,
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
