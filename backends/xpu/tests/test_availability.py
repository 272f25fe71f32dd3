"""The Triton tier's availability reasons, device checks and graphs, without importing triton in this process."""

from __future__ import annotations

import pytest
import torch

from paged_backend_xpu import XpuBackend
from paged_backend_xpu.environment import INTERPRET_ENV, XPU_TORCH_HINT, no_xpu_reason
from paged_core.api import DeviceGraphStrategy, EagerStrategy, GraphSupport, PagedError, TorchDeviceHooks


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (INTERPRET_ENV, "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _fake_xpu(monkeypatch: pytest.MonkeyPatch, compiled: bool, devices: int) -> None:
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: compiled)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: devices > 0)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: devices)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda index=0: "Intel(R) Data Center GPU Max 1550")


def test_cpu_only_torch_says_why_and_what_would_work(clean_env: pytest.MonkeyPatch) -> None:
    """This machine's torch: unavailable, naming the XPU wheels and the interpreter switch."""
    _fake_xpu(clean_env, compiled=False, devices=0)
    avail = XpuBackend.availability()
    assert not avail.available and avail.device == "cpu"
    assert "built without XPU support" in avail.reason and XPU_TORCH_HINT in avail.reason
    assert INTERPRET_ENV in avail.reason


def test_torch_without_torch_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch older than torch.xpu is named as such."""
    monkeypatch.delattr(torch, "xpu")
    reason = no_xpu_reason()
    assert reason is not None and "has no torch.xpu" in reason and XPU_TORCH_HINT in reason


def test_xpu_torch_without_a_gpu(clean_env: pytest.MonkeyPatch) -> None:
    _fake_xpu(clean_env, compiled=True, devices=0)
    avail = XpuBackend.availability()
    assert not avail.available and "sees no Intel GPU" in avail.reason


def test_xpu_torch_with_a_gpu(clean_env: pytest.MonkeyPatch) -> None:
    _fake_xpu(clean_env, compiled=True, devices=1)
    avail = XpuBackend.availability()
    assert avail.available and avail.device == "xpu" and "Max 1550" in avail.reason


@pytest.mark.parametrize("name", [INTERPRET_ENV, "TRITON_INTERPRET"])
def test_interpreter_switch_makes_it_available_on_cpu(clean_env: pytest.MonkeyPatch, name: str) -> None:
    clean_env.setenv(name, "1")
    avail = XpuBackend.availability()
    assert avail.available and avail.device == "cpu" and "interpreter" in avail.reason


def test_refuses_other_devices_and_a_missing_gpu(clean_env: pytest.MonkeyPatch) -> None:
    """Another device type is refused by name; an xpu device without an Intel GPU says why."""
    with pytest.raises(PagedError, match=r"runs on xpu devices \(Intel GPUs\), not meta.*PAGED_XPU_INTERPRET=1"):
        XpuBackend("meta")
    _fake_xpu(clean_env, compiled=False, devices=0)
    with pytest.raises(PagedError, match=r"cannot run on xpu.*built without XPU support"):
        XpuBackend("xpu")


def test_declares_capture_the_shared_kernels_envelope_and_xpu_graphs() -> None:
    """Graphs of any batch (XPUGraph on a GPU), the kernels' envelope, and torch.xpu's memory API as device hooks."""
    caps = XpuBackend.capabilities()
    assert caps.graph_support == GraphSupport.ANY and caps.block_sizes == (16, 32, 64)
    assert caps.head_sizes == frozenset({64, 80, 96, 128})  # 256 spills on Intel GPUs (tiles_xpu)
    assert caps.effective_kv_cache_dtypes == caps.dtypes == {torch.float32, torch.bfloat16, torch.float16}
    backend = object.__new__(XpuBackend)  # the device check needs a GPU; the hooks only read the device
    backend.device = torch.device("xpu")
    strategy = backend.graph_strategy()
    assert isinstance(strategy, DeviceGraphStrategy) and strategy.device_type == "xpu"
    hooks = backend.device_hooks()
    assert isinstance(hooks, TorchDeviceHooks) and hooks.module is torch.xpu
    backend.device = torch.device("cpu")
    assert isinstance(backend.graph_strategy(), EagerStrategy)
