"""The engine end to end on a GPU in every graph mode, with one backend's kernels.

``--backend rocm`` (default; the rocm backend's Triton kernels, run by ``ci/cuda-device``), ``--backend cuda``
(paged-backend-cuda, run by ``backends/cuda/device/h200_check.sh``) or ``--backend xpu --device xpu`` (Intel GPUs,
``backends/xpu/device/xpu_check.sh``). Writes ``engine-device-BACKEND.json`` and prints a summary:

1. Greedy parity: a tiny random-weight Llama (fp32) answers 16 prompts on every model path
   (fused, transformers) in ``eager`` and ``device`` mode, token for token against transformers'
   own ``generate`` on the same weights; with the graph runner's replay counts and fallbacks.
2. Decode speed: a larger random Llama (bf16) decoding batches of 1, 8 and 64 requests,
   ``eager`` against ``device`` (tok/s of the decode phase, replays).
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


def engine(path: Path, dtype: str, mode: str, impl: str) -> Any:
    from paged_core import LLM

    return LLM(
        str(path), backend=BACKEND, device=DEVICE, dtype=dtype, kv_cache_memory="2GiB", graph_mode=mode, model_impl=impl
    )


def stats(llm: Any) -> dict[str, Any]:
    runner = llm.engine.runner
    s = runner.executor.stats
    return {
        "graph_mode": runner.graph_mode,
        "model_path": runner.forward_impl.name,
        "steps": s.steps,
        "replays": s.replays,
        "eager_steps": s.eager_steps,
        "fallbacks": dict(s.fallback_reasons),
        "warmup_s": round(s.warmup_seconds, 2),
    }


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


def decode_speed(root: Path) -> list[dict[str, Any]]:
    from paged_core import SamplingParams

    path = tiny_llama(
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
    rows = []
    for mode in ("eager", "device"):
        llm = engine(path, "bfloat16", mode, "fused")
        for batch in (1, 8, 64):
            prompts = [[3 + (i * 7 + j) % 1000 for j in range(16)] for i in range(batch)]
            params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
            llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
            accel().synchronize()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            accel().synchronize()
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rows.append({"check": "decode", "batch": batch, "tok_s": round(tokens / seconds, 1), **stats(llm)})
            print(json.dumps(rows[-1]), flush=True)
        del llm
        accel().empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "reports"))
    parser.add_argument("--backend", default="rocm", help="the backend whose kernels run (rocm, cuda, xpu)")
    parser.add_argument("--device", default="cuda", help="torch device type (cuda for NVIDIA and ROCm, xpu)")
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
        report["parity"] = parity(Path(tmp))
        report["decode"] = decode_speed(Path(tmp))
    (out / f"engine-device-{BACKEND}.json").write_text(json.dumps(report, indent=1))
    ok = all(r["identical"] == r["prompts"] for r in report["parity"])
    ok = ok and all(r["replays"] > 0 for r in report["parity"] + report["decode"] if r["graph_mode"] == "device")
    print("engine device check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
