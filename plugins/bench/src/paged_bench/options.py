"""What one ``paged bench`` invocation runs: the workload, its size, the baselines and the engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paged_bench.kv_util import KVUtilConfig
from paged_bench.workloads import WORKLOADS

BASELINES = (
    "hf-static",
    "hf-cb",
    "reference",
    "dequantized",
    "eager",
    "no-pieces",
    "vllm",
    "vllm-compiled",
    "llama.cpp",
)
"""Systems that can run beside ours: transformers static batching, its continuous batching, our reference backend,
our engine on the same checkpoint loaded with ``quantization="none"`` (packed weights dequantized: ``dequantized``),
our engine on the same weights in ``graph_mode="eager"`` (``eager``) or with ``piecewise=False`` (``no-pieces``),
vLLM's CPU build in its own environment (eager, and its default compiled mode; see ``vllm_run``), and llama.cpp's
``llama-bench`` on the same GGUF (``decode-1`` only; see ``llama_cpp_run``)."""


def parse_baselines(text: str | None) -> tuple[str, ...]:
    """``"hf-static,hf-cb"`` -> ``("hf-static", "hf-cb")``; unknown names are an error naming the choices."""
    if not text:
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class BenchOptions:
    """One benchmark run.

    ``engine`` holds flat :class:`~paged_core.engine_config.EngineConfig` fields (``EngineConfig.of``) for
    our engine (model workloads); ``kv_util`` is the simulated budget of the
    ``kv-util`` workload. ``output_len`` caps every request's output tokens
    (for quick runs; full figures leave it ``None``).
    """

    workload: str
    baselines: tuple[str, ...] = ()
    num_requests: int | None = None
    output_len: int | None = None
    seed: int = 0
    hf_batch: int = 32
    engine: dict[str, Any] = field(default_factory=dict)
    kv_util: KVUtilConfig = field(default_factory=KVUtilConfig)
    progress: bool = True
    constrained: bool = False
    """``throughput`` only: run the same requests again with a JSON schema each (see ``constrained``)."""
    lora: int | None = None
    """Model workloads: also run the requests spread over this many random adapters (see ``paged_bench.lora``)."""
    lora_rank: int = 16
    """The random adapters' rank (at most the engine's ``max_lora_rank``)."""
    kv_dtypes: tuple[str, ...] = ()
    """``throughput`` and ``kv-util``: the workload again with the KV cache in each of these dtypes (see
    ``paged_bench.kv_dtypes``), beside ours (the engine's ``kv_cache_dtype``)."""

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; choose one of {', '.join(WORKLOADS)}")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad:
            raise ValueError(f"unknown baseline(s) {', '.join(bad)}; choose from {', '.join(BASELINES)}")
        for name in ("num_requests", "output_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.hf_batch, int) or self.hf_batch < 1:
            raise ValueError(f"hf_batch must be an int >= 1, got {self.hf_batch!r}")
        if self.constrained and self.workload != "throughput":
            raise ValueError(f"--constrained applies to the throughput workload only, not {self.workload!r}")
        self._check_lora()
        if self.kv_dtypes and self.workload not in ("throughput", "kv-util"):
            raise ValueError(f"--kv-dtypes applies to the throughput and kv-util workloads, not {self.workload!r}")

    def _check_lora(self) -> None:
        for name in ("lora", "lora_rank"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.lora is None:
            return
        if not self.uses_model:
            raise ValueError(f"--lora needs a model workload; {self.workload!r} runs no model")
        max_rank = self.engine.get("max_lora_rank")
        if max_rank is not None and self.lora_rank > max_rank:
            raise ValueError(f"--lora-rank {self.lora_rank} is above --max-lora-rank {max_rank}")

    @property
    def uses_model(self) -> bool:
        """Every workload but ``kv-util`` runs a model."""
        return self.workload != "kv-util"

    def to_dict(self) -> dict[str, Any]:
        """The exact configuration, for the report."""
        return {
            "workload": self.workload,
            "baselines": list(self.baselines),
            "num_requests": self.num_requests,
            "output_len": self.output_len,
            "seed": self.seed,
            "hf_batch": self.hf_batch,
            "engine": dict(self.engine),
            "kv_util": self.kv_util.to_dict() if not self.uses_model else None,
            "constrained": self.constrained,
            "lora": None if self.lora is None else {"adapters": self.lora, "rank": self.lora_rank},
            "kv_dtypes": list(self.kv_dtypes),
        }
