"""The six sections of an engine's configuration: model, KV cache, scheduler, graphs, parallelism, speculation.

Each section is a frozen dataclass of plain field types (it travels to a
child process as msgspec JSON) and validates itself in ``__post_init__``:
errors are :class:`~paged_core.errors.ConfigError` naming the field and what
is allowed. A field's ``metadata["help"]`` is its one-line description (the
CLI flags are generated from it, see :mod:`paged_core.cli.engine_args`);
``metadata`` keys ``flag``, ``choices`` and ``metavar`` shape its flag.
``None`` in a field whose value the engine derives (``block_size``,
``num_blocks``, ``max_model_len``) means "derive it"; the KV cache manager
and the scheduler take only resolved sections (``require_resolved``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from paged_core.errors import ConfigError
from paged_core.sizes import parse_size

DTYPES = ("auto", "bfloat16", "float16", "float32")
MODEL_IMPLS = ("auto", "fused", "transformers")
QUANTIZATIONS = ("auto", "none", "int8")
"""How linear weights are held; see :func:`paged_core.loading.loader.load_model`."""
"""Which model path runs; see :mod:`paged_core.runner.forward`."""
GRAPH_MODES = ("auto", "eager", "compiled", "device")
"""How steps run; see :mod:`paged_core.runner.executors`."""
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
"""``--kv-cache-dtype`` values: the names of :data:`paged_core.contract.kv_quant.KV_CACHE_DTYPE_NAMES` (spelled
out here so reading the configuration needs no torch); see :mod:`paged_core.loading.kv_dtype`."""
POLICIES = ("fcfs", "priority")
DISTRIBUTED_INITS = ("local", "env")
"""How tensor-parallel ranks find each other; see :class:`ParallelConfig`."""
HASH_ALGORITHMS = tuple(sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake")))
"""Digests the prefix cache can chain (shake_* need a length, so they are left out)."""
MAX_BLOCK_SIZE = 4096
# Block ids travel as int32 in the block table; slots as int64.
MAX_NUM_BLOCKS = 2**31 - 1
MAX_SEED = 2**64 - 1  # torch.manual_seed's range


def _opt(default: Any, help: str, **cli: Any) -> Any:
    """A field with its default and its description (plus CLI hints such as ``flag`` or ``choices``)."""
    return field(default=default, metadata={"help": help, **cli})


def _require_int(name: str, value: object, low: int, high: int | None = None, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be an int {bound}{' or None' if optional else ''}, got {value!r}")


def _require_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


def _require_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name} must be a non-empty string or None, got {value!r}")


def _require_set(section: str, names: tuple[str, ...], config: object, user: str) -> None:
    missing = [n for n in names if getattr(config, n) is None]
    if missing:
        raise ConfigError(
            f"{user} needs a resolved {section}: {' and '.join(missing)} left None (the engine derives them "
            "when it is built); set them explicitly"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """What to load and where: the model, the backend, the compute dtype and device, and the engine's seed."""

    model: str | None = _opt(None, "local model directory or .gguf file (default: the embedded SmolLM2)")
    backend: str | None = _opt(None, "backend name (default: the best available; see `paged backends`)")
    dtype: str = _opt("auto", "compute dtype (auto: bf16 where fast, else fp32)", choices=DTYPES)
    device: str | None = _opt(None, "torch device, e.g. cuda:1 (default: the backend's)")
    trust_remote_code: bool = _opt(
        False,
        "allow model code shipped with the checkpoint (not acted on yet: only "
        "transformers' built-in architectures load)",
    )
    model_impl: str = _opt(
        "auto",
        "fused: the engine's decoder (Llama/Mistral/Qwen2/Qwen3, Gemma2/Gemma3, Qwen3-MoE/Mixtral); transformers: its "
        "modules; auto: fused where it applies",
        choices=MODEL_IMPLS,
    )
    quantization: str = _opt(
        "auto",
        "linear weights: auto keeps a GGUF's quantized blocks packed (read by the "
        "backend's kernels); none dequantizes them; int8 packs a bf16/fp16/fp32 checkpoint to "
        "int8 per output channel",
        choices=QUANTIZATIONS,
    )
    seed: int = _opt(
        0, "seed of the sampler's shared generator and of torch (requests may bring their own)", flag="--engine-seed"
    )
    batch_invariant: bool = _opt(
        False,
        "refuse to start unless this configuration is batch-invariant (a request's "
        "tokens do not depend on what it is batched with), naming each part that is not; "
        "the engine logs and reports it either way",
    )
    enable_lora: bool = _opt(False, "serve LoRA adapters (PEFT checkpoints) over the base model, several per batch")
    max_loras: int = _opt(4, "LoRA adapters resident on the device at once (a step uses at most this many)")
    max_lora_rank: int = _opt(16, "the highest LoRA rank an adapter may have")

    def __post_init__(self) -> None:
        for name in ("model", "backend", "device"):
            _require_text(name, getattr(self, name))
        _require_choice("dtype", self.dtype, DTYPES)
        _require_bool("trust_remote_code", self.trust_remote_code)
        _require_choice("model_impl", self.model_impl, MODEL_IMPLS)
        _require_choice("quantization", self.quantization, QUANTIZATIONS)
        _require_int("seed", self.seed, 0, MAX_SEED)
        _require_bool("batch_invariant", self.batch_invariant)
        _require_bool("enable_lora", self.enable_lora)
        _require_int("max_loras", self.max_loras, 1)
        _require_int("max_lora_rank", self.max_lora_rank, 1, 512)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """KV-cache geometry, budget and prefix caching.

    ``num_blocks`` includes the null block (id 0), so ``num_blocks - 1``
    blocks hold KV. When it is set it wins; else the engine derives it from
    ``kv_cache_memory`` or, without that, from free memory after profiling
    (``memory_fraction`` of a GPU; see :mod:`paged_core.loading.kv_budget`).
    """

    block_size: int | None = _opt(None, "tokens per KV block (default: the backend's)")
    kv_cache_memory: int | str | None = _opt(
        None, "KV-cache budget, e.g. 4GiB or a byte count (default: from free memory)", metavar="SIZE"
    )
    memory_fraction: float = _opt(0.9, "share of GPU memory the engine may use, weights and KV cache together")
    enable_prefix_caching: bool = _opt(True, "turn off the prefix cache", flag="--no-prefix-caching")
    hash_algorithm: str = _opt("sha256", "digest chaining the prefix cache's block hashes", choices=HASH_ALGORITHMS)
    num_blocks: int | None = _opt(None, "KV blocks including the null block (default: from kv_cache_memory)")
    kv_cache_dtype: str = _opt(
        "auto",
        "dtype the KV cache stores: auto (the compute dtype), a float dtype, or quantized with per token-head "
        "scales: int8, fp8_e4m3 (= fp8), fp8_e5m2 (the backend must declare it; see `paged backends`)",
        choices=KV_CACHE_DTYPES,
    )

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE, optional=True)
        if self.kv_cache_memory is not None:
            parse_size(self.kv_cache_memory, "kv_cache_memory")
        fraction = self.memory_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
            raise ConfigError(f"memory_fraction must be in (0, 1], got {fraction!r}")
        object.__setattr__(self, "memory_fraction", float(fraction))
        _require_bool("enable_prefix_caching", self.enable_prefix_caching)
        _require_choice("hash_algorithm", self.hash_algorithm, HASH_ALGORITHMS)
        _require_int("num_blocks", self.num_blocks, 2, MAX_NUM_BLOCKS, optional=True)
        _require_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)

    @property
    def kv_cache_bytes(self) -> int | None:
        """``kv_cache_memory`` in bytes (``None`` when unset)."""
        return None if self.kv_cache_memory is None else parse_size(self.kv_cache_memory)

    def require_resolved(self, user: str) -> tuple[int, int]:
        """``(block_size, num_blocks)``; refuses, naming ``user``, a section that still leaves them to the engine."""
        _require_set("CacheConfig", ("block_size", "num_blocks"), self, user)
        return int(self.block_size or 0), int(self.num_blocks or 0)

    @classmethod
    def from_memory(cls, budget_bytes: int, bytes_per_block: int, **kwargs: Any) -> CacheConfig:
        """Size the cache from a byte budget (all layers' K and V for one block = ``bytes_per_block``)."""
        return cls(num_blocks=blocks_for_memory(budget_bytes, bytes_per_block), **kwargs)


def blocks_for_memory(budget_bytes: int, bytes_per_block: int) -> int:
    """How many blocks (the null block included) ``budget_bytes`` holds."""
    _require_int("bytes_per_block", bytes_per_block, 1)
    if budget_bytes < 2 * bytes_per_block:
        raise ConfigError(
            f"kv_cache_memory of {budget_bytes} bytes is smaller than two blocks "
            f"({2 * bytes_per_block} bytes: one usable block plus the null block)"
        )
    return min(budget_bytes // bytes_per_block, MAX_NUM_BLOCKS)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Per-step budgets and policies.

    ``max_num_batched_tokens`` caps tokens per step across requests;
    ``max_num_seqs`` caps running requests. With chunked prefill off, a prompt
    must fit in one step's token budget.
    """

    max_model_len: int | None = _opt(None, "longest prompt + output (default: the model's, capped by the KV cache)")
    max_num_batched_tokens: int = _opt(2048, "token budget of one step")
    max_num_seqs: int = _opt(256, "most requests running at once")
    enable_chunked_prefill: bool = _opt(True, "prefill each prompt in one step", flag="--no-chunked-prefill")
    policy: str = _opt(
        "fcfs", "who is preempted first: fcfs (latest arrival) or priority (lowest priority)", choices=POLICIES
    )
    num_lookahead_tokens: int = _opt(0, "extra KV slots reserved per decode for speculative tokens")
    async_scheduling: bool | None = _opt(
        None,
        "schedule step N+1 while step N runs (outputs unchanged); default: off (measured not to pay on CPU, "
        "nor on an H200; see paged_core.engine_core.overlap)",
    )

    def __post_init__(self) -> None:
        _require_int("max_model_len", self.max_model_len, 1, optional=True)
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _require_int("max_num_seqs", self.max_num_seqs, 1)
        _require_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        _require_choice("policy", self.policy, POLICIES)
        _require_int("num_lookahead_tokens", self.num_lookahead_tokens, 0)
        if self.async_scheduling is not None:
            _require_bool("async_scheduling", self.async_scheduling)

    def require_resolved(self, user: str) -> int:
        """``max_model_len``; refuses, naming ``user``, a section that still leaves it to the engine."""
        _require_set("SchedulerConfig", ("max_model_len",), self, user)
        return int(self.max_model_len or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphConfig:
    """How steps run (see :mod:`paged_core.runner.executors`) and where compiled steps are cached."""

    graph_mode: str = _opt(
        "auto",
        "eager, compiled (torch.compile), device (CUDA/HIP/XPU graphs); auto: device "
        "graphs where the backend captures, else eager",
        choices=GRAPH_MODES,
    )
    capture_sizes: tuple[int, ...] | None = _opt(
        None, "comma-separated batch sizes that get a device graph (default 1,2,4,8,16,... up to max_num_seqs)"
    )
    compile_cache_dir: str | None = _opt(None, "root of the compiled-step cache (default ~/.cache/paged/compile)")
    piecewise: bool | None = _opt(
        None,
        "capture (device) or compile (compiled) the pieces between attention calls for steps a whole-step "
        "graph cannot hold (prefill, mixed, verify rows); default: on for device graphs of backends that "
        "capture uniform decode only and for compiled mode on backends that capture nothing; --piecewise "
        "also gives backends capturing any batch whole-step graphs for decode only",
    )

    def __post_init__(self) -> None:
        _require_choice("graph_mode", self.graph_mode, GRAPH_MODES)
        if self.piecewise is not None:
            _require_bool("piecewise", self.piecewise)
        if self.capture_sizes is not None:
            sizes = tuple(self.capture_sizes) if isinstance(self.capture_sizes, (list, tuple)) else ()
            if not sizes or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
                raise ConfigError(f"capture_sizes must be a non-empty list of ints >= 1, got {self.capture_sizes!r}")
            object.__setattr__(self, "capture_sizes", sizes)
        _require_text("compile_cache_dir", self.compile_cache_dir)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How many devices one engine spans (tensor parallel) and how many engines serve (data parallel).

    ``tensor_parallel_size`` N splits one model across N ranks on ``torch.distributed`` (gloo on CPUs,
    NCCL on CUDA): rank 0 lives with the engine core, ranks 1..N-1 are workers. ``distributed_init``
    says how the ranks meet: ``local`` starts the workers here on a free loopback port; ``env`` reads
    ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (torchrun's variables), so ranks can
    be launched on several machines (rank 0 by ``paged serve``/``generate``, the others by ``paged
    worker``). ``data_parallel_size`` M runs M engine cores behind one server. ``enable_expert_parallel``
    spreads each MoE layer's experts over the N tensor-parallel ranks instead of every rank holding
    all of them (:mod:`paged_core.parallel.experts`); a model without routed experts is refused.
    """

    tensor_parallel_size: int = _opt(1, "ranks one model is split across (tensor parallel)")
    enable_expert_parallel: bool = _opt(
        False, "spread each MoE layer's experts over the tensor-parallel ranks (expert parallel)"
    )
    data_parallel_size: int = _opt(1, "engine cores behind one server (data parallel; paged serve only)")
    distributed_init: str = _opt(
        "local",
        "how tensor-parallel ranks meet: local (workers started here) or env "
        "(MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK, ranks launched separately)",
        choices=DISTRIBUTED_INITS,
    )
    distributed_timeout: float = _opt(
        60.0, "seconds a collective or a rank's start-up may take before the engine fails with the cause"
    )

    def __post_init__(self) -> None:
        _require_int("tensor_parallel_size", self.tensor_parallel_size, 1, 1024)
        _require_int("data_parallel_size", self.data_parallel_size, 1, 1024)
        _require_bool("enable_expert_parallel", self.enable_expert_parallel)
        _require_choice("distributed_init", self.distributed_init, DISTRIBUTED_INITS)
        timeout = self.distributed_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ConfigError(f"distributed_timeout must be seconds in (0, 86400], got {timeout!r}")
        object.__setattr__(self, "distributed_timeout", float(timeout))


MAX_SPECULATIVE_TOKENS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding: draft tokens proposed each step and verified by the model in one forward.

    ``speculative`` is ``None`` (off), ``"ngram"`` (prompt lookup: the tokens that followed the
    longest earlier match, ``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens long, of the
    sequence's last tokens) or the path of a draft model sharing the target's tokenizer. Each
    step proposes up to ``num_speculative_tokens`` drafts per sequence; see
    :mod:`paged_core.speculative`.
    """

    speculative: str | None = _opt(
        None,
        "speculative decoding: ngram (prompt lookup) or a draft model's path (default: off)",
        metavar="ngram|MODEL",
    )
    num_speculative_tokens: int = _opt(3, "draft tokens proposed per sequence and step")
    prompt_lookup_max: int = _opt(4, "longest suffix the ngram proposer looks up")
    prompt_lookup_min: int = _opt(2, "shortest suffix the ngram proposer looks up")

    def __post_init__(self) -> None:
        if self.speculative is not None and (not isinstance(self.speculative, str) or not self.speculative):
            raise ConfigError(f"speculative must be None, 'ngram' or a draft model's path; got {self.speculative!r}")
        _require_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _require_int("prompt_lookup_max", self.prompt_lookup_max, 1, 64)
        _require_int("prompt_lookup_min", self.prompt_lookup_min, 1, 64)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max ({self.prompt_lookup_max})"
            )

    @property
    def enabled(self) -> bool:
        return self.speculative is not None

    @property
    def uses_draft_model(self) -> bool:
        return self.speculative is not None and self.speculative != "ngram"
