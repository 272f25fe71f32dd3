"""What a backend's tests use beyond the vendor contract (:mod:`paged_core.api`): oracles, test data, a harness.

* Oracles: :class:`ReferenceBackend` (pure-torch paged attention and cache ops) and
  :class:`ReferenceFusedOps` (the fused ops' reference); :func:`dequantize` and
  :func:`reference_linear` (a packed weight dequantized exactly in fp32, then a matmul);
  :func:`round_activations_q8` (the int8 activation rounding a packed linear may declare).
* Test data: :func:`random_packed` and :func:`quantize_blocks` (packed weights of any format).
* Harness: :class:`GraphRunner` and :class:`StaticInput` (capture and replay a step with a
  backend's graph strategy, as the engine does), :func:`strategy_problem` (whether that strategy
  can serve the declared capture) and :func:`load_registry` (check that a backend's entry point loads).

The conformance suite (``paged-conformance``) and the backends' own tests import these from here;
the engine never does. They follow the same compatibility promise as the contract
(:mod:`paged_core.contract.version`).
"""

from __future__ import annotations

from paged_core.graph import GraphRunner, StaticInput, strategy_problem
from paged_core.quant import dequantize, quantize_blocks, random_packed, reference_linear, round_activations_q8
from paged_core.reference.backend import ReferenceBackend
from paged_core.reference.fused import ReferenceFusedOps
from paged_core.registry import load_registry

__all__ = [
    "GraphRunner",
    "ReferenceBackend",
    "ReferenceFusedOps",
    "StaticInput",
    "dequantize",
    "load_registry",
    "quantize_blocks",
    "random_packed",
    "reference_linear",
    "round_activations_q8",
    "strategy_problem",
]
