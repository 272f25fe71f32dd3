"""The model workloads (``throughput``, ``prefix``, ``decode-1``, ``edit-1``, ``long``): our engine, then each baseline.

Weights are loaded once; the baselines run on the same module (transformers
with its own attention switched back on; the reference backend through a
second engine sharing the loaded model), so every system sees the same
weights in the same dtype.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from paged_bench.constrained import CONSTRAINED, SAME_LENGTHS, schema_for
from paged_bench.engine_run import engine_config_summary, run_engine, warm_up, warm_up_constrained
from paged_bench.hf_runs import run_hf_cb, run_hf_static
from paged_bench.kv_dtypes import check_declared, run_throughput_kv_dtypes
from paged_bench.lora import lora_engine_fields
from paged_bench.lora_run import run_lora
from paged_bench.machine import measure_copy_bandwidth, measure_gemm
from paged_bench.options import BenchOptions
from paged_bench.result import RunResult
from paged_bench.roofline import ModelShape, bandwidth_roofline, flops_roofline
from paged_bench.workloads import BenchRequest, fit_vocab
from paged_core.engine_config import EngineConfig
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.loading.build import bytes_per_block
from paged_core.loading.kv_dtype import resolve_kv_dtype
from paged_core.reference.backend import ReferenceBackend
from paged_core.structured import StructuredOutputs

log = logging.getLogger("paged.bench")

OURS = "paged"
NO_PREFIX_CACHE = "paged-no-prefix-cache"
NO_SPEC = "paged-no-spec"


def _kv_bytes(engine: LLMEngine) -> int:
    """Bytes of the engine's KV cache (the budget the transformers cache gets too)."""
    loaded, kv = engine.loaded, engine.core.scheduler.kv
    kv_dtype = resolve_kv_dtype(engine.config.cache.kv_cache_dtype, loaded.dtype)
    return kv.pool.num_blocks * bytes_per_block(loaded.backend, loaded.specs, kv.block_size, kv_dtype)


def _timed(engine: LLMEngine, requests: Sequence[BenchRequest], name: str, progress: bool) -> RunResult:
    warm_up(engine)
    return run_engine(engine, requests, name, progress)


def run_model_workload(opts: BenchOptions, requests: Sequence[BenchRequest]) -> dict[str, Any]:
    """Run ours and the chosen baselines; returns ``runs``, ``roofline``, ``engine``, ``model`` and ``device``."""
    config = EngineConfig.of(**opts.engine)
    if opts.workload == "prefix":
        config = config.replace(enable_prefix_caching=True)
    if opts.lora is not None:  # ours is then the base model, the figure the LoRA run is compared against
        config = config.replace(enable_lora=False)
    if {"vllm", "vllm-compiled"} & set(opts.baselines):  # a missing vLLM environment fails now, not after our run
        from paged_bench.vllm_run import check_ready

        check_ready(config.model.model)
    llama_model = None
    if "llama.cpp" in opts.baselines:  # a missing llama-bench, another workload or a non-GGUF model fail now
        from paged_bench import llama_cpp_run

        llama_model = llama_cpp_run.check_ready(config.model.model, opts.workload)[1]
    engine = LLMEngine(config)
    # A tiny model's vocabulary may not hold the workloads' ids: fold them into it (a real model's keeps them).
    requests = fit_vocab(list(requests), int(engine.loaded.model.config.get_text_config().vocab_size))
    if opts.kv_dtypes:  # a KV dtype the backend does not declare fails now, not after our run
        check_declared(engine, opts.kv_dtypes)
    summary = engine_config_summary(engine)
    runs = [_timed(engine, requests, OURS, opts.progress)]
    if opts.constrained:
        # The same engine and requests, each with a JSON schema: what structured outputs cost.
        constraints = [StructuredOutputs(json=schema_for(i)) for i in range(len(requests))]
        warm_up(engine)
        warm_up_constrained(engine, constraints[0])
        constrained = run_engine(engine, requests, CONSTRAINED, opts.progress, constraints)
        runs.append(constrained)
        assert constrained.structured is not None
        lengths = constrained.structured["output_lens"]
        matched = [BenchRequest(r.prompt_token_ids, max(1, n)) for r, n in zip(requests, lengths, strict=True)]
        runs.append(_timed(engine, matched, SAME_LENGTHS, opts.progress))
    if opts.lora is not None:
        # Same weights and requests, each on one of N random adapters: what serving adapters costs.
        lora_config = config.replace(**lora_engine_fields(opts.engine, opts.lora, opts.lora_rank))
        runs.append(run_lora(engine, lora_config, requests, opts.lora, opts.lora_rank, opts.seed, opts.progress))
    kv_dtypes = None
    if opts.kv_dtypes:
        # Same weights and requests, the KV cache in each other dtype; then each cache's NLL of a fixed text.
        def timed(other: LLMEngine, reqs: Sequence[BenchRequest], name: str) -> RunResult:
            return _timed(other, reqs, name, opts.progress)

        more, kv_dtypes = run_throughput_kv_dtypes(engine, config, requests, opts.kv_dtypes, timed, runs[0])
        runs += more
    if opts.workload == "prefix":
        # Same weights, fresh cache and scheduler, prefix caching off: the figure caching must beat.
        off = LLMEngine(config.replace(enable_prefix_caching=False), engine.loaded)
        runs.append(_timed(off, requests, NO_PREFIX_CACHE, opts.progress))
        del off
    if config.speculative.enabled:
        # Same weights, speculation off: the figure drafts must beat, in the same invocation.
        plain = LLMEngine(config.replace(speculative=None), engine.loaded)
        runs.append(_timed(plain, requests, NO_SPEC, opts.progress))
        del plain
    model = engine.loaded.model
    for name in opts.baselines:
        log.info("baseline %s", name)
        if name == "hf-static":
            runs.append(run_hf_static(model, requests, opts.hf_batch, opts.progress))
        elif name == "hf-cb":
            budget = config.scheduler.max_num_batched_tokens
            runs.append(run_hf_cb(model, requests, _kv_bytes(engine), budget, opts.progress))
        elif name == "reference":
            loaded = dataclasses.replace(engine.loaded, backend=ReferenceBackend(device=engine.loaded.backend.device))
            ref = LLMEngine(config.replace(block_size=engine.core.scheduler.kv.block_size), loaded)
            runs.append(_timed(ref, requests, "reference", opts.progress))
            del ref
        elif name in ("eager", "no-pieces"):  # the same weights, another way to run the step
            change: dict[str, Any] = {"graph_mode": "eager"} if name == "eager" else {"piecewise": False}
            other = LLMEngine(config.replace(**change), engine.loaded)
            runs.append(_timed(other, requests, f"paged-{name}", opts.progress))
            del other
        elif name == "dequantized":  # the same checkpoint with every weight dense, loaded again
            dense = LLMEngine(config.replace(quantization="none"))
            runs.append(_timed(dense, requests, "dequantized", opts.progress))
            dense.shutdown()
            del dense
        elif name in ("vllm", "vllm-compiled"):  # vLLM's CPU build, in its own environment (bench/vllm_run.py)
            from paged_bench.vllm_run import run_vllm

            # The same dtype ours resolved to ("auto" is machine-dependent), so both run the same arithmetic.
            resolved = config.replace(dtype=str(engine.loaded.dtype).removeprefix("torch."))
            runs.append(run_vllm(name, requests, resolved, opts.progress))
        elif name == "llama.cpp":  # llama.cpp's llama-bench on the same GGUF (bench/llama_cpp_run.py)
            from paged_bench.llama_cpp_run import run_llama_cpp

            assert llama_model is not None
            # As many threads as ours computed with (torch's intra-op threads in this process).
            runs.append(run_llama_cpp(requests, llama_model, torch.get_num_threads(), progress=opts.progress))
    shape = ModelShape.from_model(model)
    roofline = _roofline(opts.workload, shape, runs[0], requests, engine)
    if llama_model is not None:
        from paged_bench.llama_cpp_run import LlamaCppRunResult

        # llama.cpp's bandwidth share against the same copy measurement as ours (its build runs on the CPU).
        device = engine.loaded.backend.device
        same = roofline is not None and roofline["kind"] == "bandwidth" and device.type == "cpu"
        copy = roofline["copy"] if same and roofline is not None else measure_copy_bandwidth(torch.device("cpu"))
        for run in runs:
            if isinstance(run, LlamaCppRunResult):
                run.set_copy_bandwidth(copy)
    return {
        "runs": runs,
        "roofline": roofline,
        "engine": summary,
        "device": engine.loaded.backend.device,
        "kv_dtypes": kv_dtypes,
        "model": {
            "source": engine.loaded.source.name,
            "body_params": shape.body_params,
            "head_params": shape.head_params,
            "num_layers": shape.num_layers,
            "num_heads": shape.num_heads,
            "head_dim": shape.head_dim,
            "total_weight_bytes": shape.total_weight_bytes,
            "weight_bytes_per_token": shape.weight_bytes_per_token,
            "moe": shape.moe_figures(),
            "experts_implementation": None
            if shape.moe is None
            else getattr(model.config, "_experts_implementation", None),
        },
    }


def _roofline(
    workload: str, shape: ModelShape, ours: RunResult, requests: Sequence[BenchRequest], engine: LLMEngine
) -> dict[str, Any] | None:
    device, dtype = engine.loaded.backend.device, engine.loaded.dtype
    if workload == "throughput":
        # Random prompts never hit the prefix cache, so every prompt token is computed.
        counts = [(len(r.prompt_token_ids), r.max_tokens, 0) for r in requests]
        return flops_roofline(shape, counts, ours.seconds, measure_gemm(dtype, device))
    if workload in ("decode-1", "edit-1") and ours.decode_tok_s is not None:
        return bandwidth_roofline(shape, ours.decode_tok_s, measure_copy_bandwidth(device))
    return None
