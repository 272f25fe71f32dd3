"""Where the CUDA backends can run: a CUDA (not HIP) build of torch with a visible sm_80+ device.

Everything here is cheap and touches no device memory, so the registry can list the backends on any
machine, each unavailable one with the reason and what would work.
"""

from __future__ import annotations

import os

import torch

from paged_core.api import Availability

EMULATE_ENV = "PAGED_CUDA_EMULATE"
"""``PAGED_CUDA_EMULATE=1``: the ``cuda`` backend runs on CPU tensors, its CUDA sources compiled by a host C++
compiler against a small CUDA emulation (:mod:`paged_backend_cuda.emulated`); slow, for testing (conformance)."""


def emulate_requested() -> bool:
    """Whether the environment asks for the CPU emulation of the kernels."""
    return os.environ.get(EMULATE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


MIN_CAPABILITY = (8, 0)
"""Ampere and newer: the kernels use bf16 arithmetic and are compiled for sm_80, sm_86, sm_89, sm_90a."""


def _install_hint() -> str:
    return (
        "install a CUDA build of torch (e.g. pip install torch from PyPI on Linux x86_64) on a machine with an "
        "NVIDIA GPU"
    )


def refusal() -> str | None:
    """Why this process cannot run CUDA kernels, or ``None`` when it can (device 0 is checked)."""
    hip = getattr(torch.version, "hip", None)
    if hip:
        return f"this is a ROCm (HIP {hip}) build of torch; use paged-backend-rocm on AMD GPUs"
    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU-only build; {_install_hint()}"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no NVIDIA GPU"
    return device_refusal(torch.device("cuda", torch.cuda.current_device()))


def device_refusal(device: torch.device) -> str | None:
    """Why ``device`` cannot run the kernels (an older architecture), or ``None``."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"{name} is sm_{major}{minor}; the kernels need sm_80 or newer (A100, RTX 30xx/40xx, L4, H100, H200, ...)"
        )
    return None


def detect(extra: str | None = None) -> Availability:
    """Availability on ``cuda``; ``extra`` is a further reason to refuse (a library tier's missing package)."""
    why = refusal()
    if extra:
        why = extra if why is None else f"{why}; also, {extra}"  # every missing piece, not just the first
    if why is not None:
        return Availability(False, why, "cpu")
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    return Availability(True, f"{name} (sm_{major}{minor}), CUDA {torch.version.cuda}", "cuda")
