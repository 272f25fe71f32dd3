"""Where the XPU backends can run: torch's own Intel GPU support (``torch.xpu``), or the Triton interpreter.

Environment switches:

* ``PAGED_XPU_INTERPRET=1`` (or Triton's ``TRITON_INTERPRET=1``): the Triton tier (``xpu``) is available on the
  CPU and runs its kernels on CPU tensors in the Triton interpreter (slow; for testing). Triton fixes the mode
  when it is first imported, so this must be set before then.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from paged_triton.tiles import INTERPRET_TILES_ENV

INTERPRET_ENV = "PAGED_XPU_INTERPRET"
XPU_TORCH_HINT = "pip install torch --index-url https://download.pytorch.org/whl/xpu (with Intel's GPU driver)"
"""What makes ``torch.xpu`` work: PyTorch's XPU wheels (they bring ``pytorch-triton-xpu``)."""
_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def interpret_requested() -> bool:
    """Whether the environment asks for the Triton interpreter."""
    return _flag(INTERPRET_ENV) or _flag("TRITON_INTERPRET")


def enable_interpreter() -> None:
    """Ask Triton for interpreter mode if triton is not imported yet (otherwise the launch check reports it).

    The interpreter then launches Intel's tiles (unless ``PAGED_TRITON_INTERPRET_TILES`` names others), so
    conformance on CPU checks the very tile shapes an Intel GPU runs, not the interpreter's large ones.
    """
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault(INTERPRET_TILES_ENV, "xpu")


def no_xpu_reason() -> str | None:
    """Why this process cannot use an Intel GPU (``None`` when ``torch.xpu`` sees one), and what would work."""
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not hasattr(xpu, "is_available"):
        return f"this torch {torch.__version__} has no torch.xpu (torch >= 2.5 for XPU: {XPU_TORCH_HINT})"
    compiled = getattr(xpu, "_is_compiled", lambda: True)()
    if not compiled:
        return f"this torch {torch.__version__} is built without XPU support; {XPU_TORCH_HINT}"
    if not xpu.is_available() or xpu.device_count() == 0:
        return f"torch {torch.__version__} (XPU build) sees no Intel GPU: check the driver and ZE_AFFINITY_MASK"
    return None


def triton_missing_reason() -> str | None:
    """Why Triton cannot compile for Intel GPUs here (``None`` when ``triton`` is importable)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (PyTorch's XPU wheels bring it as pytorch-triton-xpu)"
    return None


# The switch must act before anything imports triton, and the engine imports it (through torch and
# transformers) before it constructs a backend; the registry imports this module first, so set it here.
if interpret_requested() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
