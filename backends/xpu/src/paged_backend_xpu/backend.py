"""XpuBackend: the shared Triton paged-attention kernels (:mod:`paged_triton`) on Intel GPUs, with XPU graphs."""

from __future__ import annotations

from dataclasses import replace

import torch

from paged_backend_xpu import environment
from paged_core.api import (
    Availability,
    BackendCapabilities,
    DeviceGraphStrategy,
    EagerStrategy,
    GraphCaptureStrategy,
    PagedError,
)
from paged_triton.backend import TritonBackend

HEAD_SIZES = frozenset({64, 80, 96, 128})
"""The shared kernels' head sizes without 256, which spills on Intel GPUs (see paged_triton.tiles_xpu)."""


class XpuBackend(TritonBackend):
    """Paged attention in Triton on ``torch.xpu``: Intel tiles and GRF mode (spill-free on pvc and dg2), XPU graphs.

    Runs on an Intel GPU through PyTorch's XPU build (its ``pytorch-triton-xpu`` compiles the kernels), and on
    CPU tensors through the Triton interpreter (``PAGED_XPU_INTERPRET=1``, or constructing it on ``cpu`` before
    triton is imported) for conformance. Launch sizes come from tensor shapes and host ints only, so any batch
    can be captured into a ``torch.xpu.XPUGraph``.
    """

    name = "xpu"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 60

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        kind = self.device.type
        if kind == "cpu":
            environment.enable_interpreter()
        elif kind == "xpu":
            why = environment.no_xpu_reason() or environment.triton_missing_reason()
            if why is not None:
                raise PagedError(f"XpuBackend cannot run on {self.device}: {why}")
        else:
            raise PagedError(
                f"XpuBackend runs on xpu devices (Intel GPUs), not {self.device}; on a CPU it runs only in the Triton "
                f"interpreter ({environment.INTERPRET_ENV}=1, device cpu), for testing"
            )
        self._load_kernels()

    @classmethod
    def availability(cls) -> Availability:
        """An XPU build of torch that sees an Intel GPU, with Triton; or the interpreter when asked for."""
        if environment.interpret_requested():
            return Availability(True, "Triton interpreter on CPU tensors (interpreter mode requested; slow)", "cpu")
        why = environment.no_xpu_reason() or environment.triton_missing_reason()
        if why is not None:
            hint = f"or set {environment.INTERPRET_ENV}=1 to run the kernels in the Triton interpreter"
            return Availability(False, f"{why}; {hint}", "cpu")
        return Availability(True, f"Intel GPU {torch.xpu.get_device_name(0)} (torch.xpu, Triton)", "xpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """The shared kernels' envelope (fp32/bf16/fp16 in any mix, blocks 16/32/64, GQA 1-16), heads 64-128."""
        return replace(super().capabilities(), head_sizes=HEAD_SIZES)

    def graph_strategy(self) -> GraphCaptureStrategy:
        """XPU graphs through ``torch.xpu.XPUGraph``; eager replay in the CPU interpreter."""
        if self.device.type == "xpu":
            return DeviceGraphStrategy("xpu")
        return EagerStrategy()
