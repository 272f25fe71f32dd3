"""The :class:`AttentionBackend` interface a hardware vendor implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from paged_core.contract.capabilities import AttentionSpec, BackendCapabilities
from paged_core.contract.device import DeviceHooks, default_device_hooks
from paged_core.contract.fused_ops import FusedOps
from paged_core.contract.graph_strategy import EagerStrategy, GraphCaptureStrategy
from paged_core.contract.kv_quant import KV_SCALE_ELEMENTS, is_quantized_kv
from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import PagedError


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this machine, and if not, why."""

    available: bool
    reason: str = ""
    device: str = "cpu"

    def __post_init__(self) -> None:
        # Written by plugins: coerce the reason, and refuse a device torch cannot parse.
        object.__setattr__(self, "available", bool(self.available))
        object.__setattr__(self, "reason", "" if self.reason is None else str(self.reason))
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise PagedError(f"Availability.device {self.device!r} is not a torch device: {exc}") from None


class AttentionBackend(ABC):
    """A paged-attention implementation for one kind of device.

    Class attributes identify the backend; ``availability`` and
    ``capabilities`` are class methods so the registry can list a backend
    without constructing it. An instance is bound to one device and serves
    every layer: KV-cache tensors are passed in per call.

    Per step the core calls :meth:`prepare` once, then for each layer
    :meth:`forward`, which writes the step's keys and values at
    ``metadata.slot_mapping`` and returns attention over the paged cache.
    Before a step whose scheduler output lists block copies, the core calls
    :meth:`copy_blocks` once for all layers.

    Rules every hook follows: metadata tensors are read-only (one
    :class:`AttentionMetadata` serves every layer of a step); ``query``,
    ``key`` and ``value`` may be non-contiguous views (for example slices of
    a fused QKV projection); outputs are new tensors in ``query.dtype``.
    """

    name: ClassVar[str]
    """Unique backend name, as used with ``--backend``."""
    api_version: ClassVar[int]
    """The plugin API version this backend was written against; required, with no default.

    Declare it as a literal (``api_version = 1``), not as ``PLUGIN_API_VERSION``: a default or
    the running core's constant would claim every core's version, and the N/N+1 promise could
    never refuse anything. The registry reports a backend that leaves it out as a load error."""
    priority: ClassVar[int] = 0
    """Higher wins automatic selection among available backends."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device if device is not None else self.availability().device)

    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Whether this backend can run here (cheap; must not allocate device memory)."""

    @classmethod
    @abstractmethod
    def capabilities(cls) -> BackendCapabilities:
        """The declared envelope; the conformance suite tests exactly this."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Shape of one layer's KV-cache tensor (keys and values together).

        The default is ``[2, num_blocks, block_size, num_kv_heads, head_size]``.
        """
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    def kv_cache_shape_for(
        self, num_blocks: int, block_size: int, spec: AttentionSpec, dtype: torch.dtype
    ) -> tuple[int, ...]:
        """Shape of one layer's cache holding KV of ``dtype`` (the KV budget counts blocks with it).

        The default is :meth:`kv_cache_shape`; for a quantized dtype (int8, fp8) each vector carries its
        scale as :data:`~paged_core.contract.kv_quant.KV_SCALE_ELEMENTS` more elements (the layout of
        :mod:`paged_core.contract.kv_quant`). A backend keeping scales elsewhere overrides this.
        """
        head_size = spec.head_size + (KV_SCALE_ELEMENTS if is_quantized_kv(dtype) else 0)
        return self.kv_cache_shape(num_blocks, block_size, spec.num_kv_heads, head_size)

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, spec: AttentionSpec, dtype: torch.dtype
    ) -> torch.Tensor:
        """Allocate one layer's zero-filled KV cache of KV dtype ``dtype`` in this backend's shape."""
        shape = self.kv_cache_shape_for(num_blocks, block_size, spec, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def prepare(self, metadata: AttentionMetadata) -> None:  # noqa: B027 - optional hook
        """Called once per step before any layer, outside captured graphs.

        The metadata builder hook: a backend may precompute per-step plans
        (split counts, work lists) into buffers it owns. Default: nothing.
        """

    @abstractmethod
    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store ``key``/``value`` ``[T, num_kv_heads, head_size]`` at ``metadata.slot_mapping``; skip slots of -1."""

    @abstractmethod
    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        """Causal attention of ``query`` ``[T, num_heads, head_size]`` over the paged cache.

        The cache already holds this step's keys and values. Returns
        ``[T, num_heads, head_size]`` in ``query.dtype``; rows at or beyond
        ``metadata.num_actual_tokens`` may hold anything.
        """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        spec: AttentionSpec,
    ) -> torch.Tensor:
        """Write this step's KV, then attend. Backends may fuse the two by overriding."""
        self.write_kv(key, value, kv_cache, metadata)
        return self.attention(query, kv_cache, metadata, spec)

    @abstractmethod
    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        """Copy whole blocks (keys and values) in every layer; ``src_to_dst`` is int64 ``[N, 2]``.

        Each row is a (source, destination) block id. The pairs of one call
        are independent: no block is a destination twice, and no destination
        is also a source (the core's KV manager guarantees it), so a backend
        may perform them in any order or in parallel.
        """

    def fused_ops(self) -> FusedOps:
        """The layer kernels (norms, activation, rotary, linear) the engine's fused decoder calls on this device.

        Default: the pure-torch reference of :class:`~paged_core.contract.fused_ops.FusedOps`.
        A backend returns a subclass overriding what it has kernels for; the
        conformance suite checks every op against the reference.
        """
        return FusedOps()

    def graph_strategy(self) -> GraphCaptureStrategy:
        """How this backend captures steps; must agree with ``capabilities().graph_support``."""
        return EagerStrategy()

    def device_hooks(self) -> DeviceHooks:
        """Memory and synchronization of this backend's device, as the engine's KV budget and profiling use them.

        Optional. The default (:func:`~paged_core.contract.device.default_device_hooks`) reads host RAM on CPUs
        and torch's per-device memory API elsewhere (``torch.cuda``, ``torch.xpu``); a backend whose device
        torch cannot measure returns its own :class:`~paged_core.contract.device.DeviceHooks`.
        """
        return default_device_hooks(self.device)
