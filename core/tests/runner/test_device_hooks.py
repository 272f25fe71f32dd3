"""The device hook: the engine's KV budget and profiling ask the backend's device, not ``torch.cuda``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paged_core.api import DeviceHooks, TorchDeviceHooks, default_device_hooks
from paged_core.config import blocks_for_memory
from paged_core.engine_config import EngineConfig
from paged_core.errors import ConfigError
from paged_core.loading.build import bytes_per_block, load, resolve
from paged_core.loading.kv_budget import CPU_DEFAULT_CAP, default_budget

MiB = 2**20


class FakeDevice(DeviceHooks):
    """A non-CUDA accelerator with 64 MiB, 16 MiB of it in use, that records what the engine asks of it."""

    host = False

    def __init__(self, device: torch.device, peak: int = 20 * MiB) -> None:
        super().__init__(device)
        self.peak, self.calls = peak, list[str]()

    def memory(self) -> tuple[int, int] | None:
        self.calls.append("memory")
        return 48 * MiB, 64 * MiB

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def reset_peak_memory(self) -> None:
        self.calls.append("reset_peak_memory")

    def peak_memory(self) -> int | None:
        self.calls.append("peak_memory")
        return self.peak


def test_default_hooks_follow_the_device_type() -> None:
    """Host RAM on cpu; torch's per-device module for cuda and xpu; a device without a memory API reports none."""
    cpu = default_device_hooks(torch.device("cpu"))
    assert type(cpu) is DeviceHooks and cpu.host
    for kind in ("cuda", "xpu"):
        hooks = default_device_hooks(torch.device(kind))
        assert isinstance(hooks, TorchDeviceHooks) and hooks.module is getattr(torch, kind) and not hooks.host
    meta = default_device_hooks(torch.device("meta"))
    assert not meta.host and meta.memory() is None and meta.peak_memory() is None


def test_cpu_default_is_a_capped_share_of_ram() -> None:
    assert 0 < default_budget(default_device_hooks(torch.device("cpu")), 0.9) <= CPU_DEFAULT_CAP


def test_device_budget_is_a_fraction_minus_what_is_in_use() -> None:
    """fraction x total, minus the larger of memory in use and the profiled peak."""
    fake = FakeDevice(torch.device("xpu"))
    assert default_budget(fake, 0.5) == 32 * MiB - 16 * MiB
    assert default_budget(fake, 0.5, peak_bytes=20 * MiB) == 32 * MiB - 20 * MiB
    with pytest.raises(ConfigError, match=r"no memory left on xpu .*memory_fraction=0.2"):
        default_budget(fake, 0.2)


def test_a_device_that_cannot_tell_its_memory_needs_an_explicit_budget() -> None:
    with pytest.raises(ConfigError, match=r"reports no free/total memory.*kv_cache_memory"):
        default_budget(default_device_hooks(torch.device("meta")), 0.9)


def test_engine_sizes_the_kv_cache_through_the_backends_hooks(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no budget given, the engine profiles and sizes the cache from the backend's (fake, non-CUDA) device."""
    config = EngineConfig.of(model=str(tiny_model_dir), backend="reference")
    loaded = load(config)
    fake = FakeDevice(torch.device("xpu"))
    monkeypatch.setattr(loaded.backend, "device_hooks", lambda: fake)
    resolved = resolve(config, loaded)
    block = resolved.cache.block_size
    assert block is not None
    fraction = config.cache.memory_fraction
    budget = int(64 * MiB * fraction) - 20 * MiB  # the profiled peak (20 MiB) exceeds what is in use (16 MiB)
    assert resolved.cache.num_blocks == blocks_for_memory(
        budget, bytes_per_block(loaded.backend, loaded.specs, block, loaded.dtype)
    )
    assert fake.calls == ["synchronize", "reset_peak_memory", "synchronize", "peak_memory", "empty_cache", "memory"]
