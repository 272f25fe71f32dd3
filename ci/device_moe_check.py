"""Routed experts on a GPU: paged-triton's kernels (``TritonFusedOps.experts`` / ``moe``) against the reference.

Run by ``ci/cuda-device`` on the lent machine (no pytest or network there: torch, triton and the workspace's
``core`` and ``backends/triton`` only). For each expert layer (Mixtral-like 8 experts top-2, Qwen3-MoE-like 128
top-8, a tanh-GELU one) and dtype (float32, bfloat16) and token count (1, 7, 64, 512): the compiled kernels'
output against ``FusedOps().experts`` in float32 on the CPU (the oracle), each token's bits alone (the first 7
tokens' rows inside a call of 512 equal a call of those 7: ``batch_invariant_moe``), a CUDA-graph capture and
replay, and the time of one call (median of 20) next to the reference on the same GPU. Writes
``moe-device.json`` under ``--out`` and exits non-zero on any mismatch. ``--device cpu`` with
``TRITON_INTERPRET=1`` runs small layers in the interpreter (a dry run of this script, no graphs).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from paged_core.api import FusedOps

LAYERS = (("mixtral-like", 8, 2, 1024, 1792, "silu"), ("qwen3moe-like", 128, 8, 1024, 384, "silu"))
LAYERS += (("gelu", 16, 4, 512, 256, "gelu_tanh"),)
TOLERANCE = {torch.float32: (2e-3, 2e-3), torch.bfloat16: (3e-2, 3e-2)}


SMALL = (("small", 4, 2, 64, 32, "silu"), ("small-gelu", 8, 4, 32, 48, "gelu_tanh"))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time(fn: object, dev: torch.device, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        _sync(dev)
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        _sync(dev)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    from paged_triton.fused import TritonFusedOps

    dev, ops, ref, gen = torch.device(args.device), TritonFusedOps(), FusedOps(), torch.Generator().manual_seed(0)
    rows, failures = [], []
    for name, experts, top_k, hidden, inter, act in LAYERS if dev.type == "cuda" else SMALL:
        gu = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
        dn = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
        for dtype in (torch.float32, torch.bfloat16):
            packed = ops.pack_experts(gu.to(dev, dtype), dn.to(dev, dtype))
            oracle = ref.pack_experts(gu.to(dtype).float(), dn.to(dtype).float())
            for tokens in (1, 7, 64, 512) if dev.type == "cuda" else (1, 7, 40):
                x = torch.randn(tokens, hidden, generator=gen).to(dtype)
                w = torch.rand(tokens, top_k, generator=gen).softmax(-1)
                ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
                got = ops.experts(x.to(dev), w.to(dev), ids.to(dev), packed, act)
                want = ref.experts(x.float(), w, ids, oracle, act)
                atol, rtol = TOLERANCE[dtype]
                err = float((got.float().cpu() - want).abs().max())
                ok = bool(torch.allclose(got.float().cpu(), want, atol=atol, rtol=rtol))
                alone = ops.experts(x[:7].to(dev), w[:7].to(dev), ids[:7].to(dev), packed, act)
                invariant = bool(torch.equal(alone, got[:7])) if tokens >= 7 else True
                xd, wd, idd = x.to(dev), w.to(dev), ids.to(dev)
                replay_ok = True
                if dev.type == "cuda":
                    graph = torch.cuda.CUDAGraph()
                    ops.experts(xd, wd, idd, packed, act)  # warm: compile before capture
                    with torch.cuda.graph(graph):
                        captured = ops.experts(xd, wd, idd, packed, act)
                    graph.replay()
                    replay_ok = bool(torch.equal(captured, got))
                reps = 20 if dev.type == "cuda" else 1
                triton_s = _time(functools.partial(ops.experts, xd, wd, idd, packed, act), dev, reps)
                ref_packed = ref.pack_experts(gu.to(dev, dtype), dn.to(dev, dtype))
                ref_s = _time(functools.partial(ref.experts, xd, wd, idd, ref_packed, act), dev, min(reps, 5))
                row = dict(layer=name, dtype=str(dtype), tokens=tokens, max_err=err, ok=ok, invariant=invariant)
                row |= dict(graph_replay_equal=replay_ok, triton_ms=triton_s * 1e3, reference_ms=ref_s * 1e3)
                rows.append(row)
                print(json.dumps(row))
                if not (ok and invariant and replay_ok):
                    failures.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe-device.json").write_text(json.dumps({"rows": rows, "failures": failures}, indent=1))
    print(f"{len(rows) - len(failures)}/{len(rows)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
