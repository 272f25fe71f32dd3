"""Decode timing on a GPU: paged attention for batches of long contexts, reported as achieved bandwidth.

``python -m paged_backend_rocm.bench --out FILE`` times the decode step (attention over the paged KV
cache, after the keys are written) for each batch size and context length, head size 128, GQA 8, bf16.
Bandwidth counts the keys and values read once: ``batch * context * kv_heads * head * 2 * bytes``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from paged_core.api import AttentionMetadata, AttentionSpec


def _metadata(batch: int, context: int, block: int, device: torch.device) -> tuple[AttentionMetadata, int]:
    blocks_per_row = -(-context // block)
    perm = torch.randperm(batch * blocks_per_row, device=device).to(torch.int32) + 1  # block 0 is the null block
    table = perm.view(batch, blocks_per_row)
    last = (table[:, -1].long() * block + (context - 1) % block).contiguous()
    md = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        block_table=table,
        slot_mapping=last,
        block_size=block,
        num_decodes=batch,
        num_decode_tokens=batch,
        num_prefills=0,
        num_actual_tokens=batch,
        max_query_len=1,
        max_seq_len=context,
    )
    return md, batch * blocks_per_row + 1


def time_decode(
    batch: int, context: int, heads: int = 64, kv_heads: int = 8, head: int = 128, block: int = 16, iters: int = 20
) -> dict[str, float]:
    """Milliseconds per decode attention call and the bandwidth it achieves."""
    from paged_backend_rocm import RocmBackend

    device = torch.device("cuda")
    backend = RocmBackend(device)
    spec = AttentionSpec(heads, kv_heads, head)
    md, num_blocks = _metadata(batch, context, block, device)
    cache = torch.randn(backend.kv_cache_shape(num_blocks, block, kv_heads, head), dtype=torch.bfloat16, device=device)
    query = torch.randn(batch, heads, head, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        backend.attention(query, cache, md, spec)
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        backend.attention(query, cache, md, spec)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    read = batch * context * kv_heads * head * 2 * 2
    return {"batch": batch, "context": context, "ms": ms, "gb_per_s": read / ms / 1e6, "kv_bytes": read}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid, print one line per case, write JSON to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m paged_backend_rocm.bench", description=__doc__)
    parser.add_argument("--out", default=None, help="write results as JSON here")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--contexts", default="1024,8192")
    ns = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: torch sees no GPU (a ROCm or CUDA build of torch is needed)", file=sys.stderr)
        return 2
    rows = []
    for batch in (int(b) for b in ns.batches.split(",")):
        for context in (int(c) for c in ns.contexts.split(",")):
            row = time_decode(batch, context)
            rows.append(row)
            print(f"decode batch {batch:4d} context {context:5d}: {row['ms']:.3f} ms, {row['gb_per_s']:.0f} GB/s")
    if ns.out:
        with open(ns.out, "w") as fh:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows}, fh, indent=2
            )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
