"""Availability reasons and device checks, without importing triton's kernels in this process."""

from __future__ import annotations

import pytest
import torch

from paged_backend_rocm import RocmBackend
from paged_backend_rocm.environment import ALLOW_CUDA_ENV, INTERPRET_ENV
from paged_core.api import GraphSupport, PagedError


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (INTERPRET_ENV, "TRITON_INTERPRET", ALLOW_CUDA_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unavailable_on_cpu_torch_says_why(clean_env: pytest.MonkeyPatch) -> None:
    """A CPU-only torch: unavailable, naming the ROCm requirement and the interpreter switch."""
    clean_env.setattr(torch.version, "hip", None, raising=False)
    clean_env.setattr(torch.version, "cuda", None, raising=False)
    avail = RocmBackend.availability()
    assert not avail.available
    assert "ROCm build of torch" in avail.reason and INTERPRET_ENV in avail.reason


@pytest.mark.parametrize("name", [INTERPRET_ENV, "TRITON_INTERPRET"])
def test_interpreter_switch_makes_it_available_on_cpu(clean_env: pytest.MonkeyPatch, name: str) -> None:
    """Either switch makes the backend available on the CPU, in interpreter mode."""
    clean_env.setenv(name, "1")
    avail = RocmBackend.availability()
    assert avail.available and avail.device == "cpu" and "interpreter" in avail.reason


def test_rocm_torch_without_gpu(clean_env: pytest.MonkeyPatch) -> None:
    """A ROCm torch that sees no GPU is unavailable, with the HIP version in the reason."""
    clean_env.setattr(torch.version, "hip", "6.4.1", raising=False)
    clean_env.setattr(torch.cuda, "is_available", lambda: False)
    avail = RocmBackend.availability()
    assert not avail.available and "HIP 6.4.1" in avail.reason


def test_rocm_torch_with_gpu(clean_env: pytest.MonkeyPatch) -> None:
    """A ROCm torch with a visible GPU: available on "cuda" (torch's name for HIP devices)."""
    clean_env.setattr(torch.version, "hip", "6.4.1", raising=False)
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_env.setattr(torch.cuda, "device_count", lambda: 1)
    avail = RocmBackend.availability()
    assert avail.available and avail.device == "cuda"


def test_cuda_torch_needs_the_allow_switch(clean_env: pytest.MonkeyPatch) -> None:
    """An NVIDIA torch counts only with PAGED_ROCM_ALLOW_CUDA=1."""
    clean_env.setattr(torch.version, "hip", None, raising=False)
    clean_env.setattr(torch.version, "cuda", "13.0", raising=False)
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    assert not RocmBackend.availability().available
    clean_env.setenv(ALLOW_CUDA_ENV, "1")
    avail = RocmBackend.availability()
    assert avail.available and avail.device == "cuda" and ALLOW_CUDA_ENV in avail.reason


def test_refuses_other_devices() -> None:
    """A device type the kernels cannot serve is refused by name."""
    with pytest.raises(PagedError, match="cannot run on meta"):
        RocmBackend("meta")


def test_declares_capture_and_its_envelope() -> None:
    """The declared envelope the suite tests (and the AOT check compiles)."""
    caps = RocmBackend.capabilities()
    assert caps.graph_support == GraphSupport.ANY
    assert caps.block_sizes == (16, 32, 64)
    assert caps.head_sizes == frozenset({64, 80, 96, 128, 256})
    assert caps.dtypes == {torch.float32, torch.bfloat16, torch.float16}
    assert caps.effective_kv_cache_dtypes == caps.dtypes | {torch.int8, torch.float8_e4m3fn, torch.float8_e5m2}
    assert caps.sliding_window and caps.logits_soft_cap
