"""Choosing the compute dtype: ``auto`` means bf16 where the hardware does bf16 math fast."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

from paged_core.errors import ConfigError

_NAMED = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True on x86 CPUs with AVX512-BF16 or AMX-BF16 (bf16 GEMMs there run several times faster than fp32)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


def resolve_dtype(name: str, device: torch.device, packed_weights: bool = False) -> torch.dtype:
    """Map a ``--dtype`` value to a torch dtype; ``auto`` picks bf16 on GPUs and on bf16-capable CPUs, else fp32.

    On a CPU, ``auto`` is fp32 for a model whose linear weights stay packed
    (``packed_weights``): those kernels dequantize and accumulate in fp32
    whatever the activations are, so bf16 saves no weight bytes and only rounds
    every activation (on the embedded model it flipped near-tied greedy tokens
    away from the fp32 oracle's).
    """
    if name == "auto":
        if device.type == "cpu" and packed_weights:
            return torch.float32
        if device.type != "cpu" or cpu_has_fast_bf16():
            return torch.bfloat16
        return torch.float32
    try:
        return _NAMED[name]
    except KeyError:
        raise ConfigError(f"dtype must be one of auto, {', '.join(_NAMED)}; got {name!r}") from None
