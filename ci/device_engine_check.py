"""The engine end to end on a GPU in every graph mode, with one backend's kernels.

``--backend rocm`` (default; the rocm backend's Triton kernels, run by ``ci/cuda-device``), ``--backend cuda``
(paged-backend-cuda, run by ``backends/cuda/device/h200_check.sh``) or ``--backend xpu --device xpu`` (Intel GPUs,
``backends/xpu/device/xpu_check.sh``). Writes ``engine-device-BACKEND.json`` and prints a summary:

1. Greedy parity: a tiny random-weight Llama (fp32) answers 16 prompts on every model path
   (fused, transformers) in ``eager`` and ``device`` mode, token for token against transformers'
   own ``generate`` on the same weights; with the graph runner's replay counts and fallbacks.
2. Decode speed: a larger random Llama (bf16) decoding batches of 1, 8 and 64 requests,
   ``eager`` against ``device`` (tok/s of the decode phase, replays).
3. Asynchronous scheduling (``--async``): on the parity model, the synchronous and overlapped loops give the same
   greedy tokens in ``eager`` and ``device`` mode, with chunked prefill (mixed steps) and preemption; then decode
   tok/s and inter-token latency of both loops on the speed model (batch 1 and 64), so ``DEFAULT_ON`` in
   ``engine_core/overlap.py`` can be decided on measured numbers. Graph replays are recorded per captured size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("PAGED_ROCM_ALLOW_CUDA", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def tiny_llama(directory: Path, name: str, dtype: torch.dtype, **shape: Any) -> Path:
    """A seeded random-weight Llama saved as safetensors (wide weights: peaky logits, stable greedy)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    base = dict(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**base), dtype=dtype)
    out = directory / name
    model.save_pretrained(out)
    return out


def hf_greedy(path: Path, prompts: list[list[int]], new: int, dtype: torch.dtype) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").to(DEVICE).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=DEVICE)
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                do_sample=False,
                min_new_tokens=new,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    del model
    accel().empty_cache()
    return outs


BACKEND = "rocm"
DEVICE = "cuda"


def accel() -> Any:
    """torch's module for the device under test (``torch.cuda``, ``torch.xpu``)."""
    return getattr(torch, DEVICE)


def engine(path: Path, dtype: str, mode: str, impl: str, **extra: Any) -> Any:
    from paged_core import LLM

    fields: dict[str, Any] = {"kv_cache_memory": "2GiB", **extra}
    return LLM(str(path), backend=BACKEND, device=DEVICE, dtype=dtype, graph_mode=mode, model_impl=impl, **fields)


def stats(llm: Any) -> dict[str, Any]:
    runner = llm.engine.core.runner
    s = runner.executor.stats
    return {
        "graph_mode": runner.graph_mode,
        "model_path": runner.forward_impl.name,
        "steps": s.steps,
        "replays": s.replays,
        "eager_steps": s.eager_steps,
        "fallbacks": dict(s.fallback_reasons),
        "warmup_s": round(s.warmup_seconds, 2),
        "replays_by_size": {str(k): v for k, v in sorted(_graph_sizes(runner).items())},
    }


def _graph_sizes(runner: Any) -> dict[int, int]:
    """Replays per captured size, where the executor keeps a graph runner."""
    graphs = getattr(runner.executor, "graphs", None)
    return dict(getattr(getattr(graphs, "stats", None), "replays_by_size", {}) or {})


def parity(root: Path) -> list[dict[str, Any]]:
    from paged_core import SamplingParams

    path = tiny_llama(root, "parity", torch.float32)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 150))] for _ in range(16)]
    want = hf_greedy(path, prompts, 32, torch.float32)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    rows = []
    for impl in ("fused", "transformers"):
        for mode in ("eager", "device"):
            llm = engine(path, "float32", mode, impl)
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            same = sum(g == w for g, w in zip(got, want, strict=True))
            rows.append(
                {"check": "parity", "model_impl": impl, "prompts": len(prompts), "identical": same, **stats(llm)}
            )
            print(json.dumps(rows[-1]), flush=True)
            del llm
            accel().empty_cache()
    return rows


def speed_llama(root: Path) -> Path:
    """The bf16 random Llama the speed checks decode with (16 layers of 1024, GQA 4)."""
    return tiny_llama(
        root,
        "speed",
        torch.bfloat16,
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
    )


DECODE_TOKENS = 128


def timed_decode(llm: Any, batch: int) -> tuple[float, float]:
    """``batch`` 16-token prompts decoding :data:`DECODE_TOKENS` each after a warm-up: (tok/s, ms per step)."""
    from paged_core import SamplingParams

    prompts = [[3 + (i * 7 + j) % 1000 for j in range(16)] for i in range(batch)]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    accel().synchronize()
    start = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    accel().synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return round(tokens / seconds, 1), round(1000 * seconds / DECODE_TOKENS, 3)


def decode_speed(root: Path) -> list[dict[str, Any]]:

    path = speed_llama(root)
    rows = []
    for mode in ("eager", "device"):
        llm = engine(path, "bfloat16", mode, "fused")
        for batch in (1, 8, 64):
            tok_s, _ = timed_decode(llm, batch)
            rows.append({"check": "decode", "batch": batch, "tok_s": tok_s, **stats(llm)})
            print(json.dumps(rows[-1]), flush=True)
        del llm
        accel().empty_cache()
    return rows


def async_loops(root: Path) -> list[dict[str, Any]]:
    """Synchronous against overlapped scheduling: same greedy tokens (mixed steps, preemption), then speed."""
    from paged_core import SamplingParams

    path = tiny_llama(root, "parity", torch.float32)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 300))] for _ in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    for mode in ("eager", "device"):
        got = {}
        for flag in (False, True):
            # A small token budget chunks the long prompts (mixed steps); a small cache forces preemption.
            llm = engine(
                path,
                "float32",
                mode,
                "fused",
                async_scheduling=flag,
                max_num_batched_tokens=128,
                kv_cache_memory="6MiB",
            )
            got[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            row = {"check": "async-parity", "async": flag, **stats(llm)}
            row["preemptions"] = int(getattr(llm.engine.core.scheduler, "num_preemptions", -1))
            rows.append(row)
            del llm
            accel().empty_cache()
        same = sum(a == b for a, b in zip(got[False], got[True], strict=True))
        rows.append({"check": "async-parity", "graph_mode": mode, "prompts": len(prompts), "identical": same})
        print(json.dumps(rows[-3:]), flush=True)
    path = speed_llama(root)
    for mode in ("eager", "device"):
        for flag in (False, True):
            llm = engine(path, "bfloat16", mode, "fused", async_scheduling=flag)
            for batch in (1, 64):
                tok_s, ms_per_step = timed_decode(llm, batch)
                row = {
                    "check": "async-speed",
                    "async": flag,
                    "batch": batch,
                    "tok_s": tok_s,
                    "ms_per_step": ms_per_step,
                }
                rows.append({**row, **stats(llm)})
                print(json.dumps(rows[-1]), flush=True)
            del llm
            accel().empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "reports"))
    parser.add_argument("--backend", default="rocm", help="the backend whose kernels run (rocm, cuda, xpu)")
    parser.add_argument("--device", default="cuda", help="torch device type (cuda for NVIDIA and ROCm, xpu)")
    parser.add_argument("--async", dest="async_", action="store_true", help="also compare the two scheduling loops")
    parser.add_argument("--only-async", action="store_true", help="only the scheduling loops (a short device run)")
    args = parser.parse_args()
    global BACKEND, DEVICE
    BACKEND, DEVICE = args.backend, args.device
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not hasattr(torch, DEVICE) or not accel().is_available():
        print(f"device_engine_check: no {DEVICE} device", file=sys.stderr)
        return 3
    report: dict[str, Any] = {"device": accel().get_device_name(), "torch": torch.__version__, "backend": BACKEND}
    with tempfile.TemporaryDirectory() as tmp:
        report["parity"] = [] if args.only_async else parity(Path(tmp))
        report["decode"] = [] if args.only_async else decode_speed(Path(tmp))
        report["async"] = async_loops(Path(tmp)) if args.async_ or args.only_async else []
    (out / f"engine-device-{BACKEND}.json").write_text(json.dumps(report, indent=1))
    checked = report["parity"] + [r for r in report["async"] if "identical" in r]
    ok = all(r["identical"] == r["prompts"] for r in checked)
    ok = ok and all(r["replays"] > 0 for r in report["parity"] + report["decode"] if r.get("graph_mode") == "device")
    print("engine device check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
