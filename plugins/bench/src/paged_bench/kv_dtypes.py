"""``--kv-dtypes``: the workload again with the KV cache in other dtypes, beside ours, in one invocation.

``throughput``: one more engine per KV dtype on the same loaded weights (run ``paged-kv-<name>``), timed on the
same requests after the same warm-up, then each engine's NLL per token of a fixed English text (this package's
LICENSE, the text ``tests/e2e`` scores packed weights with) through its own KV cache: output tok/s and NLL
against ``auto`` (the compute dtype). ``kv-util``: the same requests through the scheduler once per KV dtype on
one byte budget (``--kv-tokens`` slots of the ``--kv-cache-dtype`` cache, default ``auto``), each with the
blocks those bytes hold in its dtype, counted in the backend's own layout (a quantized cache's scales
included); peak concurrent requests and slots against ``bfloat16``.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from paged_bench.kv_util import KVUtilConfig, simulate_paged
from paged_bench.nll import engine_nll
from paged_bench.result import RunResult
from paged_bench.workloads import BenchRequest
from paged_core.config import KV_CACHE_DTYPES
from paged_core.engine_config import EngineConfig
from paged_core.errors import ConfigError, UnsupportedConfigError
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.loading.build import bytes_per_block, choose_backend, meta_specs
from paged_core.loading.kv_dtype import kv_dtype_name, resolve_kv_dtype
from paged_core.loading.loader import resolve_source, serves_packed

log = logging.getLogger("paged.bench")

RUN_PREFIX = "paged-kv-"
"""Runs (throughput) and traces (kv-util) of the other KV dtypes are named ``paged-kv-<name>``."""
THROUGHPUT_BASELINE = "auto"
"""What the throughput and NLL ratios divide by: the cache in the compute dtype."""
KV_UTIL_BASELINE = "bfloat16"
"""What the kv-util ratios divide by: a bf16 cache (half the bytes of fp32, the usual unquantized cache)."""
ALIASES = {"fp8": "fp8_e4m3"}


def canonical(name: str) -> str:
    """One name per KV dtype (``fp8`` is ``fp8_e4m3``, as in vLLM)."""
    return ALIASES.get(name, name)


def parse_kv_dtypes(text: str | None) -> tuple[str, ...]:
    """``"auto,bfloat16,fp8,int8"`` -> ``("auto", "bfloat16", "fp8_e4m3", "int8")``; unknown names are an error."""
    if not text:
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KV_CACHE_DTYPES]
    if unknown:
        raise ValueError(
            f"--kv-dtypes: unknown KV dtype(s) {', '.join(unknown)}; choose from {', '.join(KV_CACHE_DTYPES)}"
        )
    return tuple(dict.fromkeys(canonical(n) for n in names))


def run_name(name: str) -> str:
    return RUN_PREFIX + name


def fixed_text() -> str:
    """The fixed English text NLL is measured on: paged-bench's LICENSE (the repository's, ~2,200 tokens of
    SmolLM2), read from the installed distribution's metadata."""
    dist = importlib.metadata.distribution("paged-bench")
    for path in ("licenses/LICENSE", "LICENSE"):
        text = dist.read_text(path)
        if text:
            return text
    raise FileNotFoundError("paged-bench's LICENSE is not in its installed metadata (the NLL text)")


def _entry(name: str, kv_dtype: torch.dtype, backend: str, per_block: int, num_blocks: int) -> dict[str, Any]:
    return {
        "name": name,
        "kv_dtype": kv_dtype_name(kv_dtype),
        "backend": backend,
        "bytes_per_block": per_block,
        "num_blocks": num_blocks,
    }


# ---- throughput ----------------------------------------------------------------------------------------------


def check_declared(engine: LLMEngine, names: Sequence[str]) -> None:
    """Refuse, before anything is timed, a KV dtype the loaded backend does not declare (every run shares it)."""
    loaded = engine.loaded
    caps = type(loaded.backend).capabilities()
    for name in names:
        kv = resolve_kv_dtype(name, loaded.dtype)
        if kv not in caps.effective_kv_cache_dtypes:
            declared = ", ".join(sorted(kv_dtype_name(d) for d in caps.effective_kv_cache_dtypes))
            raise UnsupportedConfigError(
                f"--kv-dtypes {name}: backend {loaded.backend.name!r} does not declare KV dtype {kv_dtype_name(kv)} "
                f"(it declares {declared}); every KV dtype runs on the same backend and weights"
            )


def nll_ids(engine: LLMEngine) -> list[int] | None:
    """The fixed text's token ids, cut to the engine's ``max_model_len`` (``None``: the model has no tokenizer)."""
    if engine.tokenizer is None:
        return None
    ids: list[int] = engine.tokenizer.encode(fixed_text())
    return ids[: engine.core.scheduler.max_len]


def _engine_entry(engine: LLMEngine, name: str, run: str, ids: list[int] | None) -> dict[str, Any]:
    loaded, kv = engine.loaded, engine.core.scheduler.kv
    kv_dtype = resolve_kv_dtype(engine.config.cache.kv_cache_dtype, loaded.dtype)
    per_block = bytes_per_block(loaded.backend, loaded.specs, kv.block_size, kv_dtype)
    entry = _entry(name, kv_dtype, loaded.backend.name, per_block, kv.pool.num_usable_blocks)
    entry["run"] = run
    # engine_nll drives the engine's runner over its own KV cache: the NLL of the text read back in this dtype.
    entry["nll"] = engine_nll(engine, ids) if ids is not None else None
    return entry


def run_throughput_kv_dtypes(
    engine: LLMEngine,
    config: EngineConfig,
    requests: Sequence[BenchRequest],
    names: Sequence[str],
    timed: Callable[[LLMEngine, Sequence[BenchRequest], str], RunResult],
    ours: RunResult,
) -> tuple[list[RunResult], dict[str, Any]]:
    """The runs of the other KV dtypes (``timed(engine, requests, name)`` warms up and times one), and the
    ``kv_dtypes`` figures: one entry per dtype (ours first), NLL of the fixed text, and the ratios."""
    main = canonical(config.cache.kv_cache_dtype)
    ids = nll_ids(engine)
    entries = [_engine_entry(engine, main, ours.name, ids)]
    runs: list[RunResult] = []
    for name in names:
        if name == main:
            continue
        log.info("KV dtype %s", name)
        other = LLMEngine(config.replace(kv_cache_dtype=name), engine.loaded)
        run = timed(other, requests, run_name(name))
        runs.append(run)
        entries.append(_engine_entry(other, name, run.name, ids))
        other.shutdown()
        del other
        gc.collect()  # its KV cache (as large as ours) goes before the next one is allocated
    tok_s = {e["name"]: r.output_tok_s for e, r in zip(entries, [ours, *runs], strict=True)}
    for e in entries:
        e["output_tok_s"] = tok_s[e["name"]]
    return runs, {
        "workload": "throughput",
        "baseline": THROUGHPUT_BASELINE,
        "nll_text": "LICENSE (paged-bench's, the repository's Apache-2.0 text)" if ids is not None else None,
        "nll_tokens": len(ids) if ids is not None else None,
        "entries": entries,
        "ratios": throughput_ratios(entries),
    }


def throughput_ratios(entries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``kv_<name>_vs_auto`` (output tok/s), ``nll_<name>_vs_auto`` and ``nll_<name>_agreement`` (1 - the
    relative NLL difference: 0.99 is within 1%), for every dtype beside ``auto`` when ``auto`` ran."""
    by = {e["name"]: e for e in entries}
    base = by.get(THROUGHPUT_BASELINE)
    out: dict[str, float] = {}
    if base is None:
        return out
    for name, e in by.items():
        if name == THROUGHPUT_BASELINE:
            continue
        out[f"kv_{name}_vs_auto"] = e["output_tok_s"] / base["output_tok_s"]
        if e.get("nll") is not None and base.get("nll"):
            ratio = e["nll"] / base["nll"]
            out[f"nll_{name}_vs_auto"] = ratio
            out[f"nll_{name}_agreement"] = max(0.0, 1.0 - abs(ratio - 1.0))
    return out


# ---- kv-util -------------------------------------------------------------------------------------------------


def block_costs(engine: dict[str, Any], block_size: int, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per KV dtype name: the backend the engine would choose for it, the resolved dtype and the bytes one block
    of the model costs there (read from the model's config alone: no weights are loaded)."""
    config = EngineConfig.of(**engine).replace(block_size=block_size)
    source = resolve_source(config.model.model)
    _, specs = meta_specs(source)
    packed = serves_packed(source, config.model.quantization)
    out = {}
    for name in names:
        try:
            cls, device, dtype, _ = choose_backend(config.replace(kv_cache_dtype=name), specs, packed)
        except UnsupportedConfigError as exc:
            raise ConfigError(f"kv-util --kv-dtypes {name}: {exc}") from None
        kv = resolve_kv_dtype(name, dtype)
        out[name] = {
            "backend": cls.name,
            "kv_dtype": kv,
            "bytes_per_block": bytes_per_block(cls(device=device), specs, block_size, kv),
        }
    return out


def run_kv_util_kv_dtypes(
    requests: Sequence[BenchRequest],
    config: KVUtilConfig,
    engine: dict[str, Any],
    names: Sequence[str],
    progress: bool = False,
) -> dict[str, Any]:
    """Each KV dtype through the scheduler on one byte budget: ``config.kv_tokens`` slots of the engine's
    ``kv_cache_dtype`` (ours), each dtype with the whole blocks those bytes hold. Returns the ``kv_dtypes``
    figures: one entry per dtype (ours first, its trace the ``paged`` run's budget), and the ratios."""
    main = canonical(str(engine.get("kv_cache_dtype") or "auto"))
    order = list(dict.fromkeys([main, *names]))
    costs = block_costs(engine, config.block_size, order)
    budget = config.num_blocks * costs[main]["bytes_per_block"]
    entries = []
    for name in order:
        cost = costs[name]
        blocks = budget // cost["bytes_per_block"]
        if blocks < 1:
            raise ConfigError(f"kv-util --kv-dtypes {name}: a budget of {budget} bytes holds no block")
        sized = dataclasses.replace(config, kv_tokens=blocks * config.block_size)
        trace = simulate_paged(requests, sized, progress, sized.groups, name=run_name(name))
        entry = _entry(name, cost["kv_dtype"], cost["backend"], cost["bytes_per_block"], blocks)
        entry.update(
            slots=sized.num_slots,
            peak_concurrent=trace.peak_concurrent,
            mean_concurrent=trace.to_dict()["mean_concurrent"],
            utilization=trace.utilization,
            preemptions=trace.preemptions,
        )
        entries.append(entry)
    return {
        "workload": "kv-util",
        "baseline": KV_UTIL_BASELINE,
        "budget_bytes": budget,
        "entries": entries,
        "ratios": kv_util_ratios(entries),
    }


def kv_util_ratios(entries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``peak_concurrency_<name>_vs_bfloat16`` and ``kv_slots_<name>_vs_bfloat16`` when ``bfloat16`` ran."""
    by = {e["name"]: e for e in entries}
    base = by.get(KV_UTIL_BASELINE)
    out: dict[str, float] = {}
    if base is None:
        return out
    for name, e in by.items():
        if name != KV_UTIL_BASELINE:
            out[f"peak_concurrency_{name}_vs_bfloat16"] = e["peak_concurrent"] / max(1, base["peak_concurrent"])
            out[f"kv_slots_{name}_vs_bfloat16"] = e["slots"] / base["slots"]
    return out


# ---- the summary ---------------------------------------------------------------------------------------------


def kv_dtype_lines(report: dict[str, Any]) -> list[str]:
    """The ``--kv-dtypes`` comparison in words (empty without it)."""
    kv = report.get("kv_dtypes")
    if not kv:
        return []
    ratios, base = kv["ratios"], kv["baseline"]
    lines = []
    for e in kv["entries"]:
        name = e["name"]
        line = f"KV {name} ({e['kv_dtype']} on {e['backend']}): {e['num_blocks']} blocks of {e['bytes_per_block']} B"
        if kv["workload"] == "throughput":
            nll = "-" if e["nll"] is None else f"{e['nll']:.4f}"
            line += f"; {e['output_tok_s']:.1f} output tok/s, NLL {nll}"
            tok, rel = ratios.get(f"kv_{name}_vs_{base}"), ratios.get(f"nll_{name}_vs_{base}")
            if tok is not None:
                line += f"; vs {base}: {tok:.2f}x tok/s"
            if rel is not None:
                line += f", NLL {rel - 1:+.2%}"
        else:
            line += f"; peak {e['peak_concurrent']} requests, mean {e['mean_concurrent']:.1f}"
            line += f", {e['preemptions']} preemptions"
            peak, slots = ratios.get(f"peak_concurrency_{name}_vs_{base}"), ratios.get(f"kv_slots_{name}_vs_{base}")
            if peak is not None and slots is not None:
                line += f"; vs {base}: {peak:.2f}x peak requests, {slots:.2f}x slots"
        lines.append(line)
    if kv["workload"] == "throughput" and kv["nll_tokens"]:
        lines.append(f"  NLL per token of {kv['nll_text']}, {kv['nll_tokens']} tokens, through each engine's KV cache")
    if kv["workload"] == "kv-util":
        lines.append(f"  one budget of {kv['budget_bytes']} bytes (--kv-tokens slots of the --kv-cache-dtype cache)")
    return lines
