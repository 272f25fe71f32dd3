"""RocmBackend: the shared Triton paged-attention kernels (:mod:`paged_triton`) on AMD GPUs, with HIP graphs."""

from __future__ import annotations

import torch

from paged_backend_rocm import environment
from paged_core.api import Availability, DeviceGraphStrategy, EagerStrategy, GraphCaptureStrategy, PagedError
from paged_triton.backend import QUANTIZED_KV, TritonBackend


class RocmBackend(TritonBackend):
    """Paged attention in Triton: split-K decode with a reduction, tiled causal prefill, HIP graphs.

    Runs on a ROCm GPU (torch calls it ``cuda``), on an NVIDIA GPU when ``PAGED_ROCM_ALLOW_CUDA=1``, and
    on CPU tensors through the Triton interpreter (``PAGED_ROCM_INTERPRET=1``, or constructing it on
    ``cpu`` before triton is imported). Tiles follow the device: CDNA (wave64), RDNA (wave32) or NVIDIA.
    """

    name = "rocm"
    api_version = 1  # the plugin API this backend is written for (paged-core 0.1.x implements it)
    priority = 50
    quantized_kv_dtypes = QUANTIZED_KV  # int8 and both fp8 formats compile on every AOT target (aot-report.md)

    def __init__(self, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        kind = self.device.type
        if kind == "cpu":
            environment.enable_interpreter()
        elif kind == "cuda":
            if not getattr(torch.version, "hip", None) and not environment.allow_cuda():
                raise PagedError(
                    f"RocmBackend on {self.device}: this is an NVIDIA (CUDA) torch; set "
                    f"{environment.ALLOW_CUDA_ENV}=1 to run these Triton kernels on it anyway"
                )
        else:
            raise PagedError(f"RocmBackend cannot run on {self.device} (supported: cuda for ROCm/HIP, cpu interpreter)")
        self._load_kernels()

    @classmethod
    def availability(cls) -> Availability:
        """A ROCm torch with a visible GPU; or the interpreter / an NVIDIA GPU when asked for (see environment)."""
        return environment.detect()

    def graph_strategy(self) -> GraphCaptureStrategy:
        """HIP (or CUDA) graphs through ``torch.cuda.CUDAGraph``; eager replay in the CPU interpreter."""
        if self.device.type == "cuda":
            return DeviceGraphStrategy("cuda")
        return EagerStrategy()
