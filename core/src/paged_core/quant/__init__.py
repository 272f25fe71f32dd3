"""Packed weights: the formats (GGUF blocks, int8 weight-only), their exact dequantization and their making.

The reference :func:`reference_linear` (dequantize in fp32, then matmul) is the
oracle for every backend's packed-linear kernel (:meth:`FusedOps.linear`).
"""

from paged_core.quant import arena
from paged_core.quant.activations import round_activations_q8
from paged_core.quant.dequant import dequantize, reference_linear
from paged_core.quant.formats import (
    BY_GGML_TYPE,
    FORMATS,
    INT8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q8_0,
    WeightFormat,
    weight_format,
)
from paged_core.quant.quantize import quantize_blocks, quantize_int8, random_packed
from paged_core.quant.weight import QuantizedWeight

__all__ = [
    "BY_GGML_TYPE",
    "FORMATS",
    "INT8",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q6_K",
    "Q8_0",
    "QuantizedWeight",
    "WeightFormat",
    "arena",
    "dequantize",
    "quantize_blocks",
    "quantize_int8",
    "random_packed",
    "reference_linear",
    "round_activations_q8",
    "weight_format",
]
