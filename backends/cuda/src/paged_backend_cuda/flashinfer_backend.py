"""``cuda-flashinfer``: attention through FlashInfer's paged wrappers (the ``[flashinfer]`` extra).

FlashInfer splits a step into a host-side ``plan`` (once per step, outside graphs) and device-side ``run`` calls
(one per layer). ``prepare`` builds the step's arrays (:mod:`~paged_backend_cuda.flashinfer_plan`) and re-plans
the wrappers of every attention configuration seen so far. A configuration (layer shape, window, soft cap,
scale, cache dtype) is learned at its first eager ``attention`` call, which plans it on the spot; one first
seen while a CUDA graph is being captured is refused, since ``plan`` cannot run inside a graph (the graph
runner's warm-up runs each size eagerly before capturing it).

Decode rows use ``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph mode, which fixes its batch size and keeps
its arrays in buffers given at construction. The backend cannot know which sizes the core will capture, so it
keeps one such wrapper per (decode-row count, block-table width) it meets, eager or captured, and re-plans the
one a step uses: at most one per row count in a serving engine (its table width is fixed), each holding
FlashInfer's own 8 MiB device and 8 MiB pinned scheduling buffers. Prefill rows use one
``BatchPrefillWithPagedKVCacheWrapper`` (causal, eager only: the tier declares ``UNIFORM_DECODE``). All
wrappers share one 128 MiB workspace; they run one after another on one stream.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from paged_backend_cuda import environment
from paged_backend_cuda.base import CudaBackendBase
from paged_backend_cuda.flashinfer_plan import FlashInferParams, FlashInferPlanner, FlashInferStep, attention_params
from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    GraphSupport,
    PagedError,
)

INSTALL_HINT = "flashinfer is not installed: pip install 'paged-backend-cuda[flashinfer]'"
WORKSPACE_BYTES = 128 * 1024 * 1024
"""FlashInfer's float workspace (split-KV partial results), the size its documentation recommends."""
_DTYPES = frozenset({torch.bfloat16, torch.float16})
_TENSOR_CORE_GROUP = 4
"""Above this GQA group the decode wrapper uses tensor cores: its CUDA-core kernel is compiled for groups
1, 2, 3, 4, 6 and 8 only (``csrc/batch_decode.cu``: ``DISPATCH_GQA_GROUP_SIZE``), the tensor-core one (the
prefill kernels) for any; vLLM switches at the same group size."""


def missing_flashinfer() -> str | None:
    """The install hint when ``flashinfer`` cannot be found (without importing it: that takes seconds)."""
    return INSTALL_HINT if importlib.util.find_spec("flashinfer") is None else None


@dataclass(frozen=True)
class _Config:
    """What one FlashInfer plan serves; the query is cast to the cache dtype, so one dtype covers both."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    params: FlashInferParams
    dtype: torch.dtype


@dataclass
class _Wrappers:
    """One configuration's wrappers: decode ones by (rows, block-table width), and the prefill one."""

    decode: dict[tuple[int, int], Any] = field(default_factory=dict)
    prefill: Any = None


@dataclass(frozen=True)
class _Planned:
    """The wrappers planned for the current step (``None`` where the step has no such rows)."""

    decode: Any
    prefill: Any


class FlashInferBackend(CudaBackendBase):
    """Paged attention through FlashInfer on NVIDIA GPUs (bf16/fp16), with CUDA graphs for decode steps."""

    name = "cuda-flashinfer"
    api_version = 1
    priority = 70

    @classmethod
    def availability(cls) -> Availability:
        """Available with a CUDA torch, an sm_80+ GPU and ``flashinfer`` installed."""
        return environment.detect(extra=missing_flashinfer())

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """FlashInfer's kernels: bf16/fp16 (no fp32), head sizes 64/128/256, any page size and GQA group."""
        return BackendCapabilities(
            dtypes=_DTYPES,
            kv_cache_dtypes=_DTYPES,
            # Any page size works on sm80-sm90; vLLM declares these three for Blackwell's trtllm-gen kernels.
            block_sizes=(16, 32, 64),
            head_sizes=frozenset({64, 128, 256}),
            gqa_ratios=None,
            sliding_window=True,
            logits_soft_cap=True,
            graph_support=GraphSupport.UNIFORM_DECODE,
        )

    def __init__(self, device: str | torch.device | None = None) -> None:
        missing = missing_flashinfer()
        if missing is not None:
            raise PagedError(f"{type(self).__name__} cannot run here: {missing}")
        super().__init__(device)
        try:
            flashinfer = importlib.import_module("flashinfer")
        except Exception as exc:  # a broken install fails in many ways (missing CUDA libraries, ABI, ...)
            raise PagedError(f"{type(self).__name__} cannot run here: importing flashinfer failed: {exc}") from exc
        self._start(flashinfer)

    def _start(self, flashinfer: Any) -> None:
        """Set up around a loaded ``flashinfer`` module (apart from ``__init__`` so tests can drive a stand-in)."""
        self._flashinfer = flashinfer
        # FlashInfer asks for a zeroed workspace on first use.
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._planner = FlashInferPlanner(self.device)
        self._wrappers: dict[_Config, _Wrappers] = {}
        self._step: FlashInferStep | None = None
        self._step_key: tuple[int, ...] | None = None
        self._planned: dict[_Config, _Planned] = {}

    def prepare(self, metadata: AttentionMetadata) -> None:
        """Build the step's arrays and re-plan every known configuration (host work; never inside a graph)."""
        self._planned = {}
        self._step_key = _step_key(metadata)
        self._step = self._planner.build(metadata) if metadata.seq_lens.shape[0] else None
        for config in self._wrappers:
            self._plan(config)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Decode rows through the decode wrapper, then prefill rows through the prefill wrapper, into one output."""
        self.check_attention_inputs(query, kv_cache, metadata, spec)
        capturing = _capturing(self.device)
        if _step_key(metadata) != self._step_key:
            if capturing:
                raise PagedError(f"{self.name}: prepare(metadata) must run before a step is captured")
            self.prepare(metadata)  # a caller that skipped prepare: plan now (eager only)
        out = torch.empty(query.shape, dtype=kv_cache.dtype, device=query.device)
        step = self._step
        if step is None:
            return out.to(query.dtype)
        config = _Config(spec.num_heads, spec.num_kv_heads, spec.head_size, attention_params(spec), kv_cache.dtype)
        planned = self._planned.get(config)
        if planned is None:
            if capturing:
                raise PagedError(
                    f"{self.name}: attention configuration {config} first seen during CUDA graph capture; FlashInfer "
                    "plans outside graphs, so run one eager step with it first (the graph runner's warm-up does)"
                )
            planned = self._plan(config)
        q = query.to(kv_cache.dtype)  # FlashInfer runs with q in the cache dtype; the output is cast back
        cache = (kv_cache[0], kv_cache[1])  # paged's [2, blocks, block, Hkv, D] is FlashInfer's NHD pair
        if planned.decode is not None:
            d = step.num_decodes
            planned.decode.run(q[:d].contiguous(), cache, out=out[:d])
        if planned.prefill is not None:
            start, end = step.prefill_token_start, step.prefill_token_start + step.num_prefill_tokens
            planned.prefill.run(q[start:end].contiguous(), cache, out=out[start:end])
        return out.to(query.dtype)

    def _plan(self, config: _Config) -> _Planned:
        """Plan ``config``'s wrappers for the current step and remember them for its layers."""
        step = self._step
        if step is None:
            raise PagedError(f"{self.name}: no step prepared")
        wrappers = self._wrappers.setdefault(config, _Wrappers())
        shape = (config.num_heads, config.num_kv_heads, config.head_size, step.block_size)
        options = {
            "window_left": config.params.window_left,
            "logits_soft_cap": config.params.logits_soft_cap,
            "sm_scale": config.params.sm_scale,
            "q_data_type": config.dtype,
            "kv_data_type": config.dtype,
        }
        decode = prefill = None
        if step.num_decodes:
            decode = self._decode_wrapper(config, wrappers, step.num_decodes, step.table_width)
            decode.plan(step.decode_kv_indptr, step.decode_kv_indices, step.decode_kv_last_page_len, *shape, **options)
        if step.num_prefills:
            if wrappers.prefill is None:
                wrappers.prefill = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            prefill = wrappers.prefill
            prefill.plan(
                step.prefill_qo_indptr,
                step.prefill_kv_indptr,
                step.prefill_kv_indices,
                step.prefill_kv_last_page_len,
                *shape,
                causal=True,
                **options,
            )
        planned = _Planned(decode, prefill)
        self._planned[config] = planned
        return planned

    def _decode_wrapper(self, config: _Config, wrappers: _Wrappers, rows: int, width: int) -> Any:
        """The CUDA-graph-mode decode wrapper for ``rows`` rows of at most ``width`` pages, created on first use.

        Its arrays live in buffers of its own (``plan`` copies the step's arrays in), sized for ``rows`` rows of
        ``width`` pages, so a captured graph keeps valid pointers whatever the planner's buffers do later.
        """
        key = (rows, width)
        wrapper = wrappers.decode.get(key)
        if wrapper is None:

            def buffer(size: int) -> torch.Tensor:
                return torch.zeros(size, dtype=torch.int32, device=self.device)

            wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=config.num_heads // config.num_kv_heads > _TENSOR_CORE_GROUP,
                paged_kv_indptr_buffer=buffer(rows + 1),
                paged_kv_indices_buffer=buffer(rows * width),
                paged_kv_last_page_len_buffer=buffer(rows),
            )
            wrappers.decode[key] = wrapper
        return wrapper


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _step_key(metadata: AttentionMetadata) -> tuple[int, ...]:
    """What identifies a step's batch to this backend without reading any tensor's values.

    The graph runner prepares its static metadata and then runs the step with a new metadata object over the
    same tensors, so identity of the object is not enough; the tensors' addresses and the host ints are.
    """
    return (
        metadata.seq_lens.data_ptr(),
        int(metadata.seq_lens.shape[0]),
        metadata.block_table.data_ptr(),
        int(metadata.block_table.shape[1]),
        metadata.num_decodes,
        metadata.num_prefills,
        metadata.block_size,
    )
