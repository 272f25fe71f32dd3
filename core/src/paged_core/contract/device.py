"""The device hook: what the engine asks of a device when it sizes the KV cache and profiles memory.

A backend exposes it through :meth:`~paged_core.contract.backend.AttentionBackend.device_hooks` (optional).
The default, :func:`default_device_hooks`, keeps the engine's behaviour on CUDA and CPUs and serves any device
whose torch module has CUDA's memory API (``torch.xpu`` has it): free/total memory, synchronize, empty cache and
peak statistics. A vendor whose device has none of that overrides the hook instead of patching the engine.
"""

from __future__ import annotations

from types import ModuleType

import psutil
import torch


class DeviceHooks:
    """Memory and synchronization of one device. This base class is the host (CPU): RAM, nothing to wait for."""

    host = True
    """Whether the KV cache lives in host RAM, which it shares with everything else (the budget is then a
    modest share of available RAM instead of a fraction of the device)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def memory(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of the device, or ``None`` when the device cannot tell."""
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def synchronize(self) -> None:
        """Wait for the device's queued work (timings and peak statistics are honest after it)."""

    def empty_cache(self) -> None:
        """Return cached, unused allocations to the device (after profiling)."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-allocation measurement."""

    def peak_memory(self) -> int | None:
        """Bytes allocated at the peak since :meth:`reset_peak_memory` (``None``: not measurable here)."""
        return None


class TorchDeviceHooks(DeviceHooks):
    """A device driven through torch's per-device module (``torch.cuda``, ``torch.xpu``) and its memory API."""

    host = False

    def __init__(self, device: torch.device, module: ModuleType) -> None:
        super().__init__(device)
        self.module = module

    def memory(self) -> tuple[int, int] | None:
        free, total = self.module.mem_get_info(self.device)
        return int(free), int(total)

    def synchronize(self) -> None:
        self.module.synchronize(self.device)

    def empty_cache(self) -> None:
        self.module.empty_cache()

    def reset_peak_memory(self) -> None:
        self.module.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> int | None:
        return int(self.module.max_memory_allocated(self.device))


class UnknownDeviceHooks(DeviceHooks):
    """A device torch has no memory API for: the engine needs an explicit KV budget on it."""

    host = False

    def memory(self) -> tuple[int, int] | None:
        return None


_MEMORY_API = ("mem_get_info", "synchronize", "empty_cache", "reset_peak_memory_stats", "max_memory_allocated")


def default_device_hooks(device: torch.device) -> DeviceHooks:
    """The hooks the engine uses unless a backend overrides them: host RAM on ``cpu``; torch's per-device module
    where it has the memory API (``cuda``, which ROCm builds share, and ``xpu``); else memory unknown."""
    if device.type == "cpu":
        return DeviceHooks(device)
    module = getattr(torch, device.type, None)
    if isinstance(module, ModuleType) and all(callable(getattr(module, name, None)) for name in _MEMORY_API):
        return TorchDeviceHooks(device, module)
    return UnknownDeviceHooks(device)
