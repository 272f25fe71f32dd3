"""VllmXpuKernelsBackend (``xpu-vllm-kernels``): paged attention through vLLM's SYCL kernels for Intel GPUs.

vllm-xpu-kernels (PyPI, checked at 0.1.16.2) is what vLLM itself runs on Intel GPUs. Its wheel declares no
dependencies but is built against one XPU torch (0.1.16.2's README: torch 2.14.0+xpu, oneAPI 2026.1) and links
``libtorch_xpu``/``libsycl``, so it imports only into that XPU torch; this module imports it lazily, on
construction. Two of its calls are used:

* ``torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
  kv_cache_dtype, k_scale, v_scale)``, registered by ``import vllm_xpu_kernels._C`` (``csrc/torch_bindings.cpp``,
  namespace ``_C`` + ``_cache_ops``). One work-group per slot_mapping entry; a slot below 0 returns at once
  (``csrc/cache.cpp``, ``reshape_and_cache_flash_kernel``: ``if (slot_idx < 0) return;``), so padding is skipped
  on the device and the launch shape is the tensor's. ``"auto"`` stores in the key's dtype: keys and values are
  cast to the cache dtype first.
* ``vllm_xpu_kernels.flash_attn_varlen_func`` over every row of a step in one call (see
  :mod:`~paged_backend_xpu.vllm_kernels_plan`); the cache halves ``kv_cache[0]``/``kv_cache[1]`` are its
  ``[blocks, block_size, kv_heads, head_size]`` key and value caches, so paged's default layout is kept.

The envelope is what the PyPI wheel's default kernel set runs natively for every combination the
capabilities allow (``libattn_kernels_xe_2.so`` instantiates a fixed list of decode policies
``(gqa bucket 8|16, head, kv tile)`` x ``(causal, local, sink)`` and chunk-prefill policies; a missing one makes
the wrapper fall back to a slow PyTorch reference that reads tensors on the host, which cannot be captured and
whose window test mishandles ``W = 1``): bf16/fp16 only (``flash_api.cpp``: "VLLM Kernel XPU only supports fp16
and bf16 type"), head sizes 64 and 128, blocks that are multiples of 64 (kv tile 64; sizes 16 and 32 lack the
sliding-window decode kernels at head 64), GQA groups up to 8 (larger groups use the 16-bucket, which has no
sliding-window decode kernel at head 64), sliding window, no soft cap.

Pure-decode steps run the split-K decode kernel, whose launch depends only on shapes and host ints, behind a
write that skips slot -1 on the device: ``GraphSupport.UNIFORM_DECODE`` with XPU graphs. Mixed steps are not
declared capturable: the chunk-prefill path treats empty trailing rows (``ANY`` graphs' padding) as decode rows,
which was not checked on hardware.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paged_backend_xpu import environment
from paged_backend_xpu.vllm_kernels_plan import plan_vllm_kernels
from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphCaptureStrategy,
    GraphSupport,
    PagedError,
    UnsupportedConfigError,
    check_attention_inputs,
    check_default_cache,
    check_write_inputs,
)

MODULE = "vllm_xpu_kernels"
CHECKED_VERSION = "0.1.16.2"
INSTALL_HINT = (
    "vllm-xpu-kernels is not installed: `pip install vllm-xpu-kernels` into the XPU torch it was built for "
    "(0.1.16.2: torch 2.14.0+xpu from https://download.pytorch.org/whl/xpu, Python 3.12, Intel GPU driver)"
)
_DTYPES = frozenset({torch.bfloat16, torch.float16})
HEAD_SIZES = frozenset({64, 128})
BLOCK_SIZES = (64, 128, 256)
GQA_RATIOS = frozenset(range(1, 9))


@dataclass(frozen=True)
class VllmXpuKernels:
    """The two library calls this tier uses, bound from an imported ``vllm_xpu_kernels``."""

    flash_attn_varlen_func: Callable[..., torch.Tensor]
    reshape_and_cache_flash: Callable[..., None]
    version: str


def missing_library() -> str | None:
    """The install hint when ``vllm_xpu_kernels`` cannot be found (without importing it)."""
    return INSTALL_HINT if importlib.util.find_spec(MODULE) is None else None


def load_library() -> VllmXpuKernels:
    """Import ``vllm_xpu_kernels`` (registering its ops) and bind the two calls; ``PagedError`` says what failed."""
    missing = missing_library()
    if missing is not None:
        raise PagedError(missing)
    try:
        interface: Any = importlib.import_module(f"{MODULE}.flash_attn_interface")
        importlib.import_module(f"{MODULE}._C")  # registers torch.ops._C_cache_ops
    except Exception as exc:  # an ABI mismatch fails in many ways (undefined symbols, missing libsycl, ...)
        raise PagedError(
            f"importing {MODULE} failed under torch {torch.__version__}: {exc} (each vllm-xpu-kernels release is "
            "built for one XPU torch; 0.1.16.2 for torch 2.14.0+xpu)"
        ) from exc
    if not getattr(interface, "FA2_AVAILABLE", True):  # the wrapper swallows this import error
        raise PagedError(f"{MODULE}'s attention library did not load: {interface.FA2_UNAVAILABLE_REASON}")
    try:
        version = importlib.metadata.version("vllm-xpu-kernels")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return VllmXpuKernels(
        flash_attn_varlen_func=interface.flash_attn_varlen_func,
        reshape_and_cache_flash=torch.ops._C_cache_ops.reshape_and_cache_flash,
        version=version,
    )


def _bind(device: torch.device) -> VllmXpuKernels:
    """Check that ``device`` is a usable Intel GPU, then load the library.

    The test seam: this is the one function through which the backend reaches both the device check and
    the library, so tests replace it (``monkeypatch.setattr(vllm_kernels_backend, "_bind", ...)``) to drive
    the backend's real code on CPU tensors against a stand-in with the library's signatures.
    """
    if device.type != "xpu":
        raise PagedError(f"VllmXpuKernelsBackend runs on Intel GPUs (device 'xpu'), not on {device}")
    why = environment.no_xpu_reason()
    if why is not None:
        raise PagedError(f"VllmXpuKernelsBackend cannot run here: {why}")
    return load_library()


class VllmXpuKernelsBackend(AttentionBackend):
    """vllm-xpu-kernels' paged attention and KV write on Intel GPUs (bf16/fp16, heads 64/128, blocks of 64n)."""

    name = "xpu-vllm-kernels"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 65  # above the Triton tier `xpu` (60): vLLM's own tuned kernels when they are installed

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device if device is not None else "xpu")
        self._lib = _bind(self.device)
        # reshape_and_cache_flash takes scale tensors even in "auto" mode (it reads them only for fp8 caches).
        self._unit_scale = torch.ones((), dtype=torch.float32, device=self.device)

    @classmethod
    def availability(cls) -> Availability:
        """Available on ``xpu`` with an XPU torch that sees an Intel GPU and ``vllm_xpu_kernels`` installed."""
        why = environment.no_xpu_reason()
        if why is None:
            why = missing_library()
        if why is not None:
            return Availability(available=False, reason=why, device="xpu")
        return Availability(available=True, reason="vLLM's SYCL paged-attention kernels", device="xpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """What vllm-xpu-kernels 0.1.16.2's PyPI wheel runs natively for every combination allowed (module doc)."""
        return BackendCapabilities(
            dtypes=_DTYPES,
            kv_cache_dtypes=_DTYPES,
            block_sizes=BLOCK_SIZES,
            head_sizes=HEAD_SIZES,
            gqa_ratios=GQA_RATIOS,
            sliding_window=True,
            logits_soft_cap=False,
            graph_support=GraphSupport.UNIFORM_DECODE,
            extra={"library": "vllm-xpu-kernels", "checked_version": CHECKED_VERSION},
        )

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store the step's keys and values through ``reshape_and_cache_flash`` (slot ``-1`` skipped in-kernel)."""
        check_default_cache(kv_cache, metadata.block_size)
        check_write_inputs(key, value, metadata, kv_cache.shape[3], kv_cache.shape[4])
        self._lib.reshape_and_cache_flash(
            _token_rows(key, kv_cache.dtype),
            _token_rows(value, kv_cache.dtype),
            kv_cache[0],
            kv_cache[1],
            metadata.slot_mapping,
            "auto",
            self._unit_scale,
            self._unit_scale,
        )

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """One ``flash_attn_varlen_func`` call over every row; the query is cast to the cache dtype, the output back."""
        check_default_cache(kv_cache, metadata.block_size)
        if spec.logits_soft_cap is not None:
            raise UnsupportedConfigError("logits soft cap not supported (vllm-xpu-kernels drops softcap)")
        check_attention_inputs(
            self.capabilities(), query, kv_cache.dtype, (kv_cache.shape[3], kv_cache.shape[4]), metadata, spec
        )
        if metadata.seq_lens.shape[0] == 0:
            return torch.empty_like(query)
        plan = plan_vllm_kernels(metadata, spec)
        out = torch.empty(query.shape, dtype=kv_cache.dtype, device=query.device)
        q = query[: plan.num_tokens].to(kv_cache.dtype).contiguous()
        self._lib.flash_attn_varlen_func(
            q, kv_cache[0], kv_cache[1], out=out[: plan.num_tokens], **plan.varlen_kwargs()
        )
        return out.to(query.dtype)

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy (source, destination) block pairs in every layer with one indexed copy per layer.

        The library has no ``copy_blocks`` (only ``swap_blocks`` between devices); the core guarantees that
        no destination is a source, so one gather/scatter per layer is exact.
        """
        if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
            raise PagedError(f"src_to_dst must be [N, 2], got shape {tuple(src_to_dst.shape)}")
        for layer, cache in enumerate(kv_caches):
            if cache.dim() != 5 or cache.shape[0] != 2:
                raise PagedError(f"layer {layer}: kv_cache must be [2, blocks, block_size, heads, dim]")
        if src_to_dst.shape[0] == 0:
            return
        pairs = src_to_dst.to(device=self.device, dtype=torch.int64)
        src, dst = pairs[:, 0], pairs[:, 1]
        for cache in kv_caches:
            cache[:, dst] = cache[:, src]

    def graph_strategy(self) -> GraphCaptureStrategy:
        """XPU graphs (``torch.xpu.XPUGraph``) for pure-decode steps; eager elsewhere (the CPU test seam)."""
        return DeviceGraphStrategy("xpu") if self.device.type == "xpu" else EagerStrategy()


def _token_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` with each token's ``[heads, head_size]`` dense (the kernel walks a token as one run)."""
    x = x.to(dtype)
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    return x
