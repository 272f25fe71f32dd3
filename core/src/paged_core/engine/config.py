"""EngineConfig: every knob of one engine, validated up front with the field named."""

from __future__ import annotations

from dataclasses import dataclass

from paged_core.config import POLICIES
from paged_core.errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
GRAPH_MODES = ("auto", "eager", "compiled", "device")
"""How steps run; see :mod:`paged_core.engine.executors`."""
MODEL_IMPLS = ("auto", "fused", "transformers")
"""Which model path runs; see :mod:`paged_core.engine.forward`."""


@dataclass(frozen=True)
class EngineConfig:
    """What to load and how to run it.

    ``model`` is a local directory (safetensors + tokenizer), a ``.gguf``
    file, or ``None`` for the embedded default (SmolLM2-135M-Instruct).
    ``kv_cache_memory`` is a byte count or a size string such as ``"4GiB"``;
    ``None`` derives it from free memory after a profiling step (see
    :mod:`paged_core.engine.kv_budget`). ``max_model_len=None`` takes the
    model's own limit, capped by what the KV cache can hold.
    """

    model: str | None = None
    backend: str | None = None
    dtype: str = "auto"
    device: str | None = None
    kv_cache_memory: int | str | None = None
    memory_fraction: float = 0.9
    block_size: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    policy: str = "fcfs"
    seed: int = 0
    trust_remote_code: bool = False
    model_impl: str = "auto"
    """``fused`` (the engine's decoder for Llama/Mistral/Qwen2/Qwen3), ``transformers`` or ``auto``."""
    graph_mode: str = "auto"
    """``eager``, ``compiled``, ``device`` or ``auto`` (see :mod:`paged_core.engine.executors`)."""
    capture_sizes: tuple[int, ...] | None = None
    """Batch sizes that get a device graph (default: 1, 2, 4, 8, then multiples of 8 up to max_num_seqs)."""
    compile_cache_dir: str | None = None
    """Root of the compiled-step cache (default ``~/.cache/paged/compile``)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ConfigError(f"memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("block_size", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be an int >= 1 or None, got {value!r}")
        if self.model_impl not in MODEL_IMPLS:
            raise ConfigError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}; got {self.model_impl!r}")
        if self.graph_mode not in GRAPH_MODES:
            raise ConfigError(f"graph_mode must be one of {', '.join(GRAPH_MODES)}; got {self.graph_mode!r}")
        if self.capture_sizes is not None:
            sizes = tuple(self.capture_sizes)
            if not sizes or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
                raise ConfigError(f"capture_sizes must be a non-empty list of ints >= 1, got {self.capture_sizes!r}")
            object.__setattr__(self, "capture_sizes", sizes)
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
