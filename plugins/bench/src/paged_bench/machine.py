"""The machine a benchmark ran on, and its measured ceilings: batched GEMM rate and memory copy bandwidth."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

GEMM_SHAPE = (256, 576, 49152)
"""(M, K, N) of the roofline matmul: 256 tokens through SmolLM2's LM head, the widest GEMM of the default model."""
COPY_BYTES = 128 * 2**20
"""Size of the tensor copied for the bandwidth figure: far larger than any cache, small enough for a shared machine."""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, Any]:
    """CPU, cores, accelerator, OS and the versions every figure depends on."""
    import psutil

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "device": str(device),
        "accelerator": None,
        "versions": {d: _version(d) for d in ("torch", "transformers", "paged-core", "paged-backend-cpu")},
    }
    if device.type == "cuda" and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(device)
    return info


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU), so wall-clock times are honest."""
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        sync = getattr(module, "synchronize", None)
        if callable(sync):
            sync()


def time_best(fn: Callable[[], object], device: torch.device, min_seconds: float = 0.5, max_reps: int = 50) -> float:
    """Best-of-N seconds for one call of ``fn`` (after one warm-up); stops after ``min_seconds`` of repeats.

    The best, not the mean: on a shared machine the fastest run is the one
    least disturbed by neighbours, so it is closest to the hardware's ceiling.
    """
    fn()
    synchronize(device)
    best = float("inf")
    start = time.perf_counter()
    for _ in range(max_reps):
        t = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start >= min_seconds:
            break
    return best


def measure_gemm(dtype: torch.dtype, device: torch.device, shape: tuple[int, int, int] = GEMM_SHAPE) -> dict[str, Any]:
    """FLOP/s of one ``[M, K] @ [K, N]`` matmul in ``dtype`` on ``device``."""
    m, k, n = shape
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    with torch.inference_mode():
        seconds = time_best(lambda: torch.matmul(a, b, out=out), device)
    return {
        "shape": [m, k, n],
        "dtype": str(dtype).removeprefix("torch."),
        "seconds": seconds,
        "flops_per_s": 2 * m * k * n / seconds,
    }


def measure_copy_bandwidth(device: torch.device, num_bytes: int = COPY_BYTES) -> dict[str, Any]:
    """Bytes per second moved by a large tensor copy, counting the read and the write."""
    src = torch.ones(num_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = time_best(lambda: dst.copy_(src), device)
    return {"bytes": num_bytes, "seconds": seconds, "bytes_per_s": 2 * num_bytes / seconds}
