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
4. Piecewise capture (always, or alone with ``--only-pieces``): greedy parity with mixed steps (chunked prefill,
   preemption) replayed as pieces, on the backend narrowed to uniform-decode capture (piecewise by default there)
   and on the any-batch backend with ``piecewise=True``; then inter-token latency of requests arriving while
   others decode (most steps mixed) on the speed model: eager, decode graphs with mixed steps eager, decode
   graphs plus pieces, and whole-step graphs of any batch.
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


def uniform_decode(llm: Any, **changes: Any) -> Any:
    """An LLM on ``llm``'s weights whose backend declares uniform-decode capture only (as the flash-attn and
    FlashInfer backends do), with ``changes`` to its configuration: the case piecewise capture is for."""
    import dataclasses

    from paged_core import LLM, LLMEngine
    from paged_core.api import GraphSupport

    loaded = llm.engine.loaded
    cls = type(loaded.backend)
    declared = dataclasses.replace(cls.capabilities(), graph_support=GraphSupport.UNIFORM_DECODE)
    narrowed = type(f"UniformDecode{cls.__name__}", (cls,), {"capabilities": classmethod(lambda c: declared)})
    backend = narrowed.__new__(narrowed)
    backend.__dict__.update(loaded.backend.__dict__)
    clone = LLM.__new__(LLM)
    clone.engine = LLMEngine(llm.engine.config.replace(**changes), dataclasses.replace(loaded, backend=backend))
    return clone


PIECE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def arrivals(llm: Any, prompts: list[list[int]], every: int, new: int) -> dict[str, Any]:
    """Requests arriving one every ``every`` steps while the others decode (so most steps mix a prompt chunk with
    decodes): inter-token latency p50/p99 over every request's gaps, and the wall time."""
    from paged_core import SamplingParams

    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    pending, seen, gaps, step = list(prompts), {}, [], 0
    accel().synchronize()
    start = time.perf_counter()
    while pending or eng.has_unfinished_requests():
        if pending and step % every == 0:
            eng.add_request(pending.pop(0), params)
        outs = eng.step()
        now = time.perf_counter()
        step += 1
        for out in outs:
            count = len(out.outputs[0].token_ids)
            last = seen.get(out.request_id)
            if last is not None and count > last[1]:
                gaps.extend([(now - last[0]) / (count - last[1])] * (count - last[1]))
            seen[out.request_id] = (now, count)
    wall = time.perf_counter() - start
    gaps.sort()
    return {
        "itl_p50_ms": round(1000 * gaps[len(gaps) // 2], 3),
        "itl_p99_ms": round(1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], 3),
        "itl_mean_ms": round(1000 * sum(gaps) / len(gaps), 3),
        "wall_s": round(wall, 3),
        "steps": step,
    }


def pieces(root: Path) -> list[dict[str, Any]]:
    """Piecewise capture: parity against transformers with mixed steps as pieces, then ITL with and without."""
    from paged_core import SamplingParams

    rows: list[dict[str, Any]] = []
    path = tiny_llama(root, "parity", torch.float32)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 300))] for _ in range(24)]
    want = hf_greedy(path, prompts, 32, torch.float32)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    base = engine(path, "float32", "eager", "fused")
    tight = {"graph_mode": "device", "capture_sizes": PIECE_SIZES, "max_num_batched_tokens": 128}
    eager = {k: v for k, v in tight.items() if k != "graph_mode" and k != "capture_sizes"}
    for name, llm in (
        ("eager (the parity pieces must keep)", base.reconfigured(**eager)),
        ("uniform-decode backend, pieces (auto)", uniform_decode(base, **tight)),
        ("uniform-decode backend, pieces, preemption", uniform_decode(base, **tight, kv_cache_memory="6MiB")),
        ("any-batch backend, --piecewise", base.reconfigured(**tight, piecewise=True)),
    ):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        same = sum(g == w for g, w in zip(got, want, strict=True))
        s = llm.engine.core.runner.executor.stats
        row = {"check": "pieces-parity", "case": name, "prompts": len(prompts), "identical": same, **stats(llm)}
        row.update(piece_replays=s.piece_replays, preemptions=int(llm.engine.core.scheduler.num_preemptions))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del llm
        accel().empty_cache()
    del base
    path = speed_llama(root)
    speed = engine(path, "bfloat16", "eager", "fused")
    prompts = [[3 + (i * 7 + j) % 1000 for j in range(384)] for i in range(32)]
    budget = {"max_num_batched_tokens": 192, "capture_sizes": PIECE_SIZES}
    for name, llm in (
        ("eager", speed.reconfigured(max_num_batched_tokens=192)),
        ("decode graphs, mixed eager", uniform_decode(speed, graph_mode="device", piecewise=False, **budget)),
        ("decode graphs + pieces", uniform_decode(speed, graph_mode="device", **budget)),
        ("whole-step graphs (any batch)", speed.reconfigured(graph_mode="device", **budget)),
    ):
        row = {"check": "pieces-itl", "case": name, **arrivals(llm, prompts, every=4, new=64)}
        s = llm.engine.core.runner.executor.stats
        rows.append({**row, **stats(llm), "piece_replays": s.piece_replays})
        print(json.dumps(rows[-1]), flush=True)
        del llm
        accel().empty_cache()
    return rows


LORA_SPECS = (
    {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    {"r": 8, "lora_alpha": 16, "use_rslora": True, "target_modules": ["q_proj", "k_proj", "o_proj", "down_proj"]},
    {"r": 16, "lora_alpha": 32, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
)


def lora(root: Path) -> list[dict[str, Any]]:
    """Multi-LoRA on the device: a batch mixing the base model and three PEFT adapters (ranks 4/8/16), token for
    token against transformers + PEFT on the same device, together, with chunked prefill, and with two slots."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from paged_core import LoRARequest, SamplingParams

    path = tiny_llama(root, "parity", torch.float32)
    loras = []
    for i, spec in enumerate(LORA_SPECS):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), LoraConfig(**spec))
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for key, param in model.named_parameters():
                if "lora_" in key:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
        model.save_pretrained(root / f"lora{i}")
        loras.append(LoRARequest(f"lora{i}", i + 1, str(root / f"lora{i}")))
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 150))] for _ in range(16)]
    assigned = [([None, *loras])[i % 4] for i in range(len(prompts))]
    want: list[list[int]] = [[] for _ in prompts]
    for adapter in [None, *loras]:
        base: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        model = PeftModel.from_pretrained(base, adapter.path) if adapter is not None else base
        model = model.to(DEVICE).eval()
        with torch.inference_mode():
            for i in (i for i, a in enumerate(assigned) if a is adapter):
                x = torch.tensor([prompts[i]], device=DEVICE)
                y = model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=24,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
                want[i] = y[0, x.shape[1] :].tolist()
        del model, base
        accel().empty_cache()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    first = engine(path, "float32", "auto", "fused", enable_lora=True)
    for case, changes in (
        ("together", {}),
        ("chunked prefill", {"max_num_batched_tokens": 64}),
        ("two slots, three adapters", {"max_loras": 2}),
    ):
        llm = first.reconfigured(**changes) if changes else first
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=assigned)]
        same = sum(g == w for g, w in zip(got, want, strict=True))
        slots = llm.engine.core.runner.lora
        row = {"check": "lora", "case": case, "prompts": len(prompts), "identical": same, "loads": slots.loads}
        rows.append({**row, **stats(llm), "fused_ops": llm.engine.loaded.backend.fused_ops().name})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "reports"))
    parser.add_argument("--backend", default="rocm", help="the backend whose kernels run (rocm, cuda, xpu)")
    parser.add_argument("--device", default="cuda", help="torch device type (cuda for NVIDIA and ROCm, xpu)")
    parser.add_argument("--async", dest="async_", action="store_true", help="also compare the two scheduling loops")
    parser.add_argument("--only-async", action="store_true", help="only the scheduling loops (a short device run)")
    parser.add_argument("--only-pieces", action="store_true", help="only piecewise capture: parity and ITL")
    parser.add_argument("--only-lora", action="store_true", help="only multi-LoRA parity against PEFT")
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
        only = args.only_async or args.only_pieces or args.only_lora
        report["parity"] = [] if only else parity(Path(tmp))
        report["decode"] = [] if only else decode_speed(Path(tmp))
        report["async"] = async_loops(Path(tmp)) if (args.async_ and not only) or args.only_async else []
        report["pieces"] = pieces(Path(tmp)) if not (args.only_async or args.only_lora) else []
        report["lora"] = lora(Path(tmp)) if args.only_lora else []
    (out / f"engine-device-{BACKEND}.json").write_text(json.dumps(report, indent=1))
    checked = report["parity"] + [r for r in report["async"] + report["pieces"] + report["lora"] if "identical" in r]
    ok = all(r["identical"] == r["prompts"] for r in checked)
    ok = ok and all(r["replays"] > 0 for r in report["parity"] + report["decode"] if r.get("graph_mode") == "device")
    ok = ok and all(
        r["piece_replays"] > 0
        for r in report["pieces"]
        if r["check"] == "pieces-parity" and r["graph_mode"] == "device"
    )
    print("engine device check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
