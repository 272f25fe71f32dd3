"""Availability and device refusals of the CUDA backends, with torch's answers faked (no GPU here)."""

from __future__ import annotations

import pytest
import torch

from paged_backend_cuda import build
from paged_backend_cuda.backend import CudaBackend
from paged_core.api import PagedError


@pytest.fixture
def nvidia(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CUDA torch that sees one sm_90 GPU and has the kernels built."""
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(build, "find_library", lambda: None)
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    return monkeypatch


def test_this_cpu_torch_is_unavailable_with_the_reason() -> None:
    """The real answer on this machine: a CPU-only torch, and what to install instead."""
    avail = CudaBackend.availability()
    if torch.version.cuda:  # pragma: no cover - only on a CUDA torch
        pytest.skip("this torch is a CUDA build")
    assert not avail.available and avail.device == "cpu"
    assert "CPU-only build" in avail.reason and "CUDA build of torch" in avail.reason


def test_available_on_an_sm90_gpu(nvidia: pytest.MonkeyPatch) -> None:
    avail = CudaBackend.availability()
    assert avail.available and avail.device == "cuda" and "H200" in avail.reason and "sm_90" in avail.reason


def test_hip_torch_is_refused_towards_rocm(nvidia: pytest.MonkeyPatch) -> None:
    nvidia.setattr(torch.version, "hip", "6.4.1", raising=False)
    avail = CudaBackend.availability()
    assert not avail.available and "ROCm" in avail.reason and "paged-backend-rocm" in avail.reason


def test_older_than_sm80_is_refused(nvidia: pytest.MonkeyPatch) -> None:
    nvidia.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    nvidia.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    avail = CudaBackend.availability()
    assert not avail.available and "sm_75" in avail.reason and "sm_80 or newer" in avail.reason


def test_no_gpu_visible(nvidia: pytest.MonkeyPatch) -> None:
    nvidia.setattr(torch.cuda, "is_available", lambda: False)
    avail = CudaBackend.availability()
    assert not avail.available and "sees no NVIDIA GPU" in avail.reason


def test_no_kernels_and_no_nvcc_says_how_to_get_them(nvidia: pytest.MonkeyPatch) -> None:
    nvidia.setattr(build, "find_nvcc", lambda: None)
    avail = CudaBackend.availability()
    assert not avail.available and "nvcc" in avail.reason and "paged-backend-cuda[nvcc]" in avail.reason
    assert build.LIBRARY_ENV in avail.reason


def test_construction_off_cuda_is_refused() -> None:
    with pytest.raises(PagedError, match="runs on cuda devices"):
        CudaBackend("cpu")


def test_construction_on_a_cpu_torch_names_the_reason() -> None:
    if torch.version.cuda:  # pragma: no cover - only on a CUDA torch
        pytest.skip("this torch is a CUDA build")
    with pytest.raises(PagedError, match="CPU-only build"):
        CudaBackend("cuda")


def test_emulation_switch_makes_the_own_kernels_available_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """PAGED_CUDA_EMULATE=1: ``cuda`` runs its kernels on CPU tensors (for conformance); the library tiers do not."""
    from paged_backend_cuda.environment import EMULATE_ENV
    from paged_backend_cuda.flashinfer_backend import FlashInferBackend

    monkeypatch.setenv(EMULATE_ENV, "1")
    avail = CudaBackend.availability()
    assert avail.available and avail.device == "cpu" and "emulation" in avail.reason
    assert not FlashInferBackend.availability().available
    backend = CudaBackend("cpu")
    assert type(backend.graph_strategy()).__name__ == "EagerStrategy"


def test_a_library_tier_names_every_missing_piece() -> None:
    """On this CPU torch without FlashInfer, the reason says both what torch lacks and what to install."""
    from paged_backend_cuda.flashinfer_backend import INSTALL_HINT, FlashInferBackend, missing_flashinfer

    if torch.version.cuda or missing_flashinfer() is None:  # pragma: no cover - a GPU machine or flashinfer here
        pytest.skip("needs a CPU torch without flashinfer")
    reason = FlashInferBackend.availability().reason
    assert "CPU-only build" in reason and reason.endswith("also, " + INSTALL_HINT)


def test_layer_ops_are_the_shared_triton_kernels_on_cuda_devices_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device with Triton the layer ops are paged-triton's (its experts and LoRA kernels); on CPU tensors
    (emulation) and without Triton, the reference's."""
    from paged_backend_cuda.base import fused_ops_for
    from paged_core.api import FusedOps
    from paged_triton.fused import TritonFusedOps

    assert type(fused_ops_for(torch.device("cpu"))) is FusedOps
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "triton" else None)
    assert type(fused_ops_for(torch.device("cuda", 0))) is TritonFusedOps
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert type(fused_ops_for(torch.device("cuda", 0))) is FusedOps
