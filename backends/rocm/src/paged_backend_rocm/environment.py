"""Where the kernels can run: a ROCm GPU, an NVIDIA GPU when explicitly allowed, or the Triton interpreter.

Environment switches:

* ``PAGED_ROCM_INTERPRET=1`` (or Triton's own ``TRITON_INTERPRET=1``): the backend is available on the CPU
  and runs the same kernels on CPU tensors in the Triton interpreter (slow; for testing). The mode is
  fixed for the whole process once triton is imported, so this must be set before then.
* ``PAGED_ROCM_ALLOW_CUDA=1``: accept an NVIDIA GPU (the kernels are plain Triton), e.g. to test them
  on an H100/H200.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from paged_core.api import Availability

INTERPRET_ENV = "PAGED_ROCM_INTERPRET"
ALLOW_CUDA_ENV = "PAGED_ROCM_ALLOW_CUDA"
_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def interpret_requested() -> bool:
    """Whether the environment asks for the Triton interpreter."""
    return _flag(INTERPRET_ENV) or _flag("TRITON_INTERPRET")


def allow_cuda() -> bool:
    """Whether an NVIDIA GPU may serve as this backend's device."""
    return _flag(ALLOW_CUDA_ENV)


def enable_interpreter() -> None:
    """Ask Triton for interpreter mode if triton is not imported yet (otherwise the launch check reports it)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def detect() -> Availability:
    """Availability of the backend here, with the reason when it cannot run."""
    if interpret_requested():
        return Availability(True, "Triton interpreter on CPU tensors (interpreter mode requested; slow)", "cpu")
    if importlib.util.find_spec("triton") is None:
        return Availability(False, "triton is not installed (ROCm torch ships it as pytorch-triton-rocm)", "cpu")
    hip = getattr(torch.version, "hip", None)
    if hip:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return Availability(True, f"ROCm {hip}", "cuda")
        return Availability(False, f"this ROCm build of torch (HIP {hip}) sees no AMD GPU", "cpu")
    if torch.version.cuda and allow_cuda():
        if torch.cuda.is_available():
            return Availability(True, f"NVIDIA GPU allowed by {ALLOW_CUDA_ENV}=1 (CUDA {torch.version.cuda})", "cuda")
        return Availability(False, f"{ALLOW_CUDA_ENV}=1 but torch sees no CUDA device", "cpu")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return Availability(
        False,
        f"needs a ROCm build of torch with an AMD GPU (this torch {torch.__version__} is a {build} build); "
        f"set {INTERPRET_ENV}=1 to run the kernels in the Triton interpreter on CPU"
        + ("" if not torch.version.cuda else f", or {ALLOW_CUDA_ENV}=1 to use an NVIDIA GPU"),
        "cpu",
    )


# The switch must act before anything imports triton, and the engine imports it (through torch and
# transformers) before it constructs a backend; the registry imports this module first, so set it here.
if interpret_requested() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
