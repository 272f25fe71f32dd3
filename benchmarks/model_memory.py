"""Resident memory of a loaded model: GGUF blocks kept packed against dequantized, each in a fresh process.

    python benchmarks/model_memory.py [--model FILE.gguf] [--dtype float32] [--json out.json]

Each variant runs ``LLM(..., quantization=Q, kv_cache_memory=16MiB)`` in its own Python process
and reports the process's RSS after imports (torch, transformers, paged_core) and after the load,
the difference (the model, tokenizer and a 16 MiB KV cache), and the bytes of the weights as
held (dense parameters plus packed bytes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
import psutil, torch, transformers, paged_core
from paged_core import LLM
from paged_core.runner.packed_linear import packed_bytes
proc = psutil.Process()
before = proc.memory_info().rss
model, quant, dtype = sys.argv[1] or None, sys.argv[2], sys.argv[3]
llm = LLM(model, quantization=quant, dtype=dtype, kv_cache_memory="16MiB")
after = proc.memory_info().rss
m = llm.engine.loaded.model
dense = sum(p.numel() * p.element_size() for p in {id(p): p for p in m.parameters()}.values())
print(json.dumps({"quantization": quant, "rss_before_mib": before / 2**20, "rss_after_mib": after / 2**20,
                  "rss_model_mib": (after - before) / 2**20, "dense_weight_mib": dense / 2**20,
                  "packed_weight_mib": packed_bytes(m) / 2**20}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for quant in ("auto", "none"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, args.model, quant, args.dtype], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'quantization':14s} {'RSS model MiB':>14s} {'dense MiB':>10s} {'packed MiB':>11s}")
    for r in rows:
        print(
            f"{r['quantization']:14s} {r['rss_model_mib']:14.1f} {r['dense_weight_mib']:10.1f} "
            f"{r['packed_weight_mib']:11.1f}"
        )
    print(f"packed / dequantized resident: {rows[0]['rss_model_mib'] / rows[1]['rss_model_mib']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
