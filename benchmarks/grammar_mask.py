"""Structured outputs through paged's own code path: compile time, and mask time per step at 1 and 32 rows.

Where ``benchmarks/grammar_engines.py`` compared the engines underneath (xgrammar, llguidance), this times
what the engine core runs (:mod:`paged_core.engine_core.grammars`) on the embedded model's tokenizer
(SmolLM2, 49,152 ids):

- compile: :class:`paged_core.structured.GrammarCompiler` (grammar, lexer and first mask on its pool), each
  of grammar_engines.py's 27 constraints (24 JSON schemas, a regex, a choice, a Lark grammar) ``--reps``
  times, cold (its grammar cache emptied first): ``compile_s`` as the compiler measures it on its worker,
  and ``wall`` from submission to result; then one cache hit per constraint (``cache_hit_wall``).
- mask per step at ``--rows`` constrained rows (1 and 32 by default): the matchers (constraints cycled)
  walk seeded random paths of allowed tokens; each step times :func:`paged_core.structured.fill_bitmask`
  (llguidance's executor for several rows) and the CPU backend's ``FusedOps.apply_token_bitmask`` on
  ``[rows, 49152]`` fp32 logits, apart and together (the engine's ``paged_structured_mask_seconds`` is the
  sum), plus accepting one token per row (the core does that after sampling, outside the mask time).

Not a test: the machine is shared, so read the figures with their spread. Measured on a 2-core Sapphire Rapids
(lscpu: "Intel(R) Xeon(R) Processor"; llguidance 1.9.1, torch 2.13.0+cpu at 2 threads), ms p50 / p99, shared
with other jobs (load average in the JSON):

    load ~2 (08:55)                     fill            apply           fill + apply    accept
    1 row                               0.028 / 0.19    0.13 / 35.7     0.16 / 35.7     0.022
    32 rows                             1.14 / 5.6      1.93 / 12.3     3.41 / 17.9     0.30
    compile (cold, on the worker)       0.47 / 0.98 (135 compiles of 27 constraints)

    load ~6 (09:17, the JSON)           fill            apply           fill + apply    accept
    1 row                               0.075 / 0.24    56.0 / 65.5     56.2 / 65.6     0.052
    32 rows                             6.1 / 19.4      14.8 / 139      21.3 / 140      0.33
    compile (cold) / cache hit          0.40 / 1.61; 0.009 / 0.08

Under load the apply's outliers are torch's intra-op parallel region, not the work: the same 1-row apply at
1 thread took 0.07 ms (32 rows: 5.6 ms) while at 2 threads it waited 60 ms (120 ms) for the second thread's
turn on a core. Every torch op of a step pays the same on a crowded machine; quiet, the mask at 32 rows is
~3.4 ms against a decode step of hundreds of ms.

    .venv/bin/python benchmarks/grammar_mask.py [--rows 1,32] [--reps 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_engines import CHOICE, GRAMMAR_LARK, REGEX, SCHEMAS, cpu_model, summary

RESULTS = Path(__file__).parent / "results" / "2026-12-04-grammar-mask.json"
_BITS = torch.arange(32, dtype=torch.int32)


def constraints() -> list[Any]:
    """grammar_engines.py's constraints as :class:`StructuredOutputs`."""
    from paged_core.structured import StructuredOutputs

    extra = [StructuredOutputs(regex=REGEX), StructuredOutputs(choice=CHOICE), StructuredOutputs(grammar=GRAMMAR_LARK)]
    return [*(StructuredOutputs(json=s) for s in SCHEMAS), *extra]


def apply_fn() -> tuple[str, Callable[[torch.Tensor, torch.Tensor, Sequence[int]], None]]:
    """The CPU backend's ``FusedOps.apply_token_bitmask`` (what the engine core calls), else the reference."""
    try:
        from paged_backend_cpu.fused import CpuFusedOps
    except ImportError:
        from paged_core.structured import apply_bitmask

        return "paged_core.structured.apply_bitmask", apply_bitmask
    return "paged_backend_cpu CpuFusedOps.apply_token_bitmask", CpuFusedOps().apply_token_bitmask


def allowed(row: torch.Tensor, vocab: int) -> list[int]:
    return torch.nonzero(((row.unsqueeze(-1) >> _BITS) & 1).flatten()[:vocab]).flatten().tolist()


def measure_compile(compiler: Any, specs: list[Any], reps: int) -> dict[str, Any]:
    """Cold compiles (the compiler's grammar cache emptied first), then one cache hit per constraint."""
    worker, wall, hits, worst = [], [], [], ("", 0.0)
    cache = getattr(compiler, "_cache", None)  # private: emptied so each rep really compiles
    for i, spec in enumerate(specs):
        for _ in range(reps):
            if cache is not None:
                cache.clear()
            t0 = time.perf_counter()
            compiled = compiler.compile(spec)
            wall.append(time.perf_counter() - t0)
            if getattr(compiled, "cached", False):
                raise AssertionError("a cold compile came from the cache")
            worker.append(compiled.compile_s)
            if compiled.compile_s > worst[1]:
                worst = (f"{spec.kind} #{i}", compiled.compile_s)
        if cache is not None:
            t0 = time.perf_counter()
            compiler.compile(spec)
            hits.append(time.perf_counter() - t0)
    return {
        "count": len(worker),
        "compile_s": summary(worker),
        "wall": summary(wall),
        "cache_hit_wall": summary(hits) if hits else None,
        "slowest": {"constraint": worst[0], "ms": worst[1] * 1e3},
    }


def measure_mask(compiler: Any, specs: list[Any], rows: int, steps: int, apply: Callable[..., None]) -> dict[str, Any]:
    """``steps`` masked steps of ``rows`` matchers (constraints cycled), each a few random tokens in."""
    from paged_core.structured import allocate_bitmask, fill_bitmask

    vocab, eos = compiler.vocab_size, 2
    grammars = [compiler.compile(s) for s in specs]
    rng = random.Random(rows)
    matchers = [grammars[i % len(grammars)].matcher() for i in range(rows)]
    bitmask = allocate_bitmask(rows, vocab)
    logits = torch.randn(rows, vocab)
    index = list(range(rows))
    fill_s, apply_s, total_s, accept_s = [], [], [], []
    for step in range(steps + 4):  # the first 4 steps walk in, untimed
        work = logits.clone()
        t0 = time.perf_counter()
        fill_bitmask(matchers, bitmask)
        t1 = time.perf_counter()
        with torch.inference_mode():
            apply(work, bitmask, index)
        t2 = time.perf_counter()
        picks = []
        for r in range(rows):
            ids = allowed(bitmask[r], vocab)
            picks.append(rng.choice([t for t in ids if t != eos] or ids))
        t3 = time.perf_counter()
        for m, token in zip(matchers, picks, strict=True):
            if not m.accept([token]):
                raise AssertionError("the grammar refused a token its own mask allowed")
        t4 = time.perf_counter()
        for r, m in enumerate(matchers):
            if m.is_terminated():
                matchers[r] = grammars[(r + step) % len(grammars)].matcher()
        if step >= 4:
            fill_s.append(t1 - t0)
            apply_s.append(t2 - t1)
            total_s.append(t2 - t0)
            accept_s.append(t4 - t3)
    return {
        "rows": rows,
        "steps": steps,
        "fill": summary(fill_s),
        "apply": summary(apply_s),
        "fill_plus_apply": summary(total_s),
        "accept": summary(accept_s),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", default="1,32", help="comma-separated constrained rows per step")
    p.add_argument("--reps", type=int, default=5, help="compiles per constraint")
    p.add_argument("--steps", type=int, default=40, help="timed mask steps per row count")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    from importlib.metadata import version

    from paged_core.loading.loader import load_tokenizer, resolve_source
    from paged_core.structured import GrammarCompiler

    load_before = os.getloadavg()
    tokenizer = load_tokenizer(resolve_source(None))
    t0 = time.perf_counter()
    compiler = GrammarCompiler(tokenizer, len(tokenizer))
    setup_s = time.perf_counter() - t0
    specs = constraints()
    apply_name, apply = apply_fn()
    compiled = measure_compile(compiler, specs, a.reps)
    masks = [measure_mask(compiler, specs, int(r), a.steps, apply) for r in a.rows.split(",")]
    compiler.close()
    c = compiled["compile_s"]
    print(f"compile (GrammarCompiler, {compiled['count']} compiles of {len(specs)} constraints), ms:")
    print(f"  on the worker  p50 {c['p50_ms']:.3f}  p99 {c['p99_ms']:.3f}  max {c['max_ms']:.3f}")
    w = compiled["wall"]
    print(f"  submit->result p50 {w['p50_ms']:.3f}  p99 {w['p99_ms']:.3f}  max {w['max_ms']:.3f}")
    h = compiled["cache_hit_wall"]
    if h is not None:
        print(f"  cache hit      p50 {h['p50_ms']:.3f}  p99 {h['p99_ms']:.3f}  max {h['max_ms']:.3f}")
    print(f"mask per step (fill_bitmask + {apply_name}), ms p50 / p99 / mean:")
    print(f"  {'rows':>5} {'fill':>24} {'apply':>24} {'fill + apply':>24} {'accept':>24}")
    for m in masks:
        cells = [f"{m[k]['p50_ms']:.3f} / {m[k]['p99_ms']:.3f} / {m[k]['mean_ms']:.3f}" for k in ("fill", "apply")]
        cells += [
            f"{m[k]['p50_ms']:.3f} / {m[k]['p99_ms']:.3f} / {m[k]['mean_ms']:.3f}"
            for k in ("fill_plus_apply", "accept")
        ]
        print(f"  {m['rows']:>5} " + " ".join(f"{x:>24}" for x in cells))
    doc = {
        "benchmark": "benchmarks/grammar_mask.py",
        "machine": {
            "cpu": cpu_model(),
            "cores": len(os.sched_getaffinity(0)),
            "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
        },
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "llguidance": version("llguidance"),
        "vocab": compiler.vocab_size,
        "apply": apply_name,
        "tokenizer_setup_ms": setup_s * 1e3,
        "constraints": {"json_schemas": len(SCHEMAS), "regex": 1, "choice": 1, "grammar": 1},
        "reps": a.reps,
        "compile": compiled,
        "mask": masks,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
