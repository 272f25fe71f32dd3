"""Choosing the KV cache's dtype: ``--kv-cache-dtype`` names, resolved against the compute dtype.

``auto`` stores keys and values in the compute dtype; any other name is a storage dtype of its own
(:data:`~paged_core.contract.kv_quant.KV_CACHE_DTYPE_NAMES`): a float dtype that differs from the compute
dtype (fp32 compute over a bf16 cache), or a quantized one (int8, fp8) whose vectors carry per token-head
scales (:mod:`paged_core.contract.kv_quant`). The backend must declare the dtype
(``capabilities().kv_cache_dtypes``); :func:`paged_core.loading.build.choose_backend` refuses it otherwise.
"""

from __future__ import annotations

import torch

from paged_core.contract.kv_quant import KV_CACHE_DTYPE_NAMES, is_quantized_kv
from paged_core.errors import ConfigError

_CANONICAL: dict[torch.dtype, str] = {
    dtype: name for name, dtype in KV_CACHE_DTYPE_NAMES.items() if dtype is not None and name != "fp8"
}
"""Each KV dtype's one name (``fp8`` is an alias of ``fp8_e4m3``)."""


def resolve_kv_dtype(name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the KV cache for a ``--kv-cache-dtype`` value (``auto``: ``compute_dtype``)."""
    if name not in KV_CACHE_DTYPE_NAMES:
        raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_NAMES)}; got {name!r}")
    dtype = KV_CACHE_DTYPE_NAMES[name]
    return compute_dtype if dtype is None else dtype


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The ``--kv-cache-dtype`` name of a KV dtype (``torch.float8_e4m3fn`` -> ``fp8_e4m3``)."""
    try:
        return _CANONICAL[dtype]
    except KeyError:
        raise ConfigError(f"{dtype} is not a KV cache dtype (known: {', '.join(map(str, _CANONICAL))})") from None


def describe_kv_dtype(dtype: torch.dtype) -> str:
    """For logs: the name, and for a quantized dtype its scales (``int8 with per token-head fp16 scales``)."""
    name = kv_dtype_name(dtype)
    return f"{name} with per token-head fp16 scales" if is_quantized_kv(dtype) else name
