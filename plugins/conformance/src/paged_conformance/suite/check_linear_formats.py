"""Packed-weight linears: each format a backend's ``fused_ops().linear_formats`` declares, against the reference.

For every declared format (``q4_0``, ``q4_1``, ``q8_0``, ``q4_k``, ``q6_k``,
``int8``; :mod:`paged_core.quant`) and declared dtype, random packed
weights go through ``ops.pack_linear(weight, bias)`` once and then
``ops.linear(x, packed)`` at several ``M``: an M sweep (1, 2, 3, 7, 16, 17,
64, 512; ``quick``: 1, 3, 17, 512) on SmolLM2-135M's k/v projection
(TinyLlama-1.1B's for the 256-blocks of ``q4_k``/``q6_k``), then ``x`` as a
column slice of a wider buffer and as every other row of one; the other
projections of real models (SmolLM2's ``[576, 576]``, ``[3072, 576]``,
``[576, 1536]``; a 7-8B model's ``[1024, 4096]`` under ``full``) at decode
and prefill-tail ``M``; and odd shapes (``N`` = 37 and 100, ``K`` one and
three blocks). Bias alternates. The oracle is
:func:`paged_core.quant.reference_linear` (exact float32 dequantization,
one float32 product, rounded once to ``x.dtype``), within

    ``|out - ref| <= 1e-4 * (|x| @ |W|.T + |bias|) + 1e-6 (+ one output ulp for bfloat16/float16)``

(``W`` the dequantized weight; the ulp is ``2**-7 |ref|`` for bfloat16,
``2**-10 |ref|`` for float16; see :mod:`paged_conformance.linear_formats`).
Every output must be a new tensor of ``[M, N]`` in ``x.dtype``, the input
buffers untouched, the packed bytes and scales given to ``pack_linear``
bit-identical after packing and after every call, and every output unchanged
after the later calls. Undeclared formats are N/A here; instead,
``test_linear_format_fallback`` packs them with the reference ``FusedOps()``
(as the engine does) and the backend's ``linear`` must multiply them too
(by handing them to ``super().linear``).
"""

from __future__ import annotations

import pytest

from paged_conformance.fused import REFERENCE, generator
from paged_conformance.grid import LinearFormatCase, linear_fallback_weights, linear_weights
from paged_conformance.linear_formats import check_declaration, check_weight, declared_formats
from paged_conformance.session import Conformance


@pytest.mark.paged_cases("linear_formats")
def test_linear_format(conformance: Conformance, linear_case: LinearFormatCase) -> None:
    """The backend's own ``pack_linear`` and ``linear`` for one declared format and dtype match the reference."""
    ops = conformance.fused_ops()
    fmt = linear_case.format
    if fmt not in declared_formats(ops):
        pytest.skip(f"N/A: {fmt} is not in {type(ops).__name__}.linear_formats")
    gen = generator(linear_case.seed)
    for spec in linear_weights(fmt, conformance.grid):
        check_weight(ops, ops.pack_linear, fmt, spec, linear_case.dtype, conformance.device, gen)


@pytest.mark.paged_capability("linear_format:fallback")
@pytest.mark.paged_cases("linear_formats")
def test_linear_format_fallback(conformance: Conformance, linear_case: LinearFormatCase) -> None:
    """An undeclared format, packed by the reference ``FusedOps()`` as the engine packs it, through the backend's
    ``linear`` (which must pass what it did not pack to ``super().linear``) matches the reference."""
    ops = conformance.fused_ops()
    fmt = linear_case.format
    if fmt in declared_formats(ops):
        pytest.skip(f"N/A: {fmt} is declared (the engine packs it with the backend's own pack_linear)")
    gen = generator(linear_case.seed)
    for spec in linear_fallback_weights(fmt):
        check_weight(
            ops,
            REFERENCE.pack_linear,
            fmt,
            spec,
            linear_case.dtype,
            conformance.device,
            gen,
            packed_by="reference-packed ",
        )


@pytest.mark.paged_capability("capability_check")
def test_linear_formats_declaration(conformance: Conformance) -> None:
    """``fused_ops().linear_formats`` is a frozenset of known format names."""
    check_declaration(conformance.fused_ops())
