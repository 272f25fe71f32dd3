"""Batch invariance: what a backend declares, bit for bit (DESIGN.md, "Batch invariance (a contract property)").

A row's output must not depend on what shares its call: a linear's or a layer op's row alone against the
same row among 1 to 511 others, in random order and in chunks; an attention query's bits decoded alone
against the same position in mixed steps of up to 17 rows, in one prefill chunk, in chunks of random sizes,
in speculative verify rows and among decode rows in shuffled order, over key ranges up to 1,283 keys (see
:mod:`paged_conformance.batch_invariance`). Checked where declared: ``capabilities().batch_invariant``
(attention), ``fused_ops().batch_invariant_layer_ops`` (``rms_norm``, ``add_rms_norm``, ``silu_and_mul``,
``rotary``, ``rotate_heads``) and each weight kind of ``fused_ops().batch_invariant_linear``; N/A elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.batch_invariance import (
    check_attention,
    check_declaration,
    check_linear,
    declared_layer_ops,
    declared_linear,
    layer_op_checks,
)
from paged_conformance.grid import (
    INVARIANCE_NORM_HIDDEN,
    INVARIANCE_ROTARY_HEADS,
    INVARIANCE_SILU_INTERMEDIATE,
    InvarianceCase,
    InvarianceLinearCase,
    base_config,
    declared_dtypes,
    dtype_name,
    invariance_rotation_sizes,
    rotary_head_sizes,
)
from paged_conformance.session import Conformance


@pytest.mark.paged_capability("batch_invariance:attention")
@pytest.mark.paged_cases("batch_invariance")
def test_batch_invariant_attention(conformance: Conformance, invariance: InvarianceCase) -> None:
    """Every query token of every step has the bits of its position decoded alone."""
    caps = conformance.caps
    if not caps.batch_invariant:
        pytest.skip("N/A: capabilities().batch_invariant is not declared")
    base = base_config(caps)
    if base is None:
        pytest.skip("N/A: no head size or GQA ratio the suite knows is declared")
    head, gqa = base
    check_attention(conformance.backend(), invariance.dtype, caps.default_block_size, head, gqa, invariance.seed)


@pytest.mark.paged_capability("batch_invariance:attention")
@pytest.mark.paged_cases("quantized_kv")
def test_batch_invariant_attention_over_a_quantized_cache(conformance: Conformance, kv_dtype: torch.dtype) -> None:
    """The same over an int8/fp8 cache (at the first declared compute dtype; a third of the random steps and the
    longest sequence's chunks, to keep the suite short): per token-head scales keep a stored vector's bits its
    own, and reading it back must not depend on the batch either."""
    caps = conformance.caps
    if not caps.batch_invariant:
        pytest.skip("N/A: capabilities().batch_invariant is not declared")
    if kv_dtype not in caps.effective_kv_cache_dtypes:
        pytest.skip(f"N/A: KV dtype {dtype_name(kv_dtype)} not declared")
    base = base_config(caps)
    if base is None:
        pytest.skip("N/A: no head size or GQA ratio the suite knows is declared")
    head, gqa = base
    dtype = declared_dtypes(caps)[0]
    check_attention(conformance.backend(), dtype, caps.default_block_size, head, gqa, 17, kv_dtype, share=3)


@pytest.mark.paged_capability("batch_invariance:layer_ops")
@pytest.mark.paged_cases("batch_invariance")
def test_batch_invariant_layer_ops(conformance: Conformance, invariance: InvarianceCase) -> None:
    """``rms_norm``, ``add_rms_norm``, ``silu_and_mul``, ``rotary`` and ``rotate_heads``: each row in any call has
    its bits alone."""
    ops = conformance.fused_ops()
    if not declared_layer_ops(ops):
        pytest.skip(f"N/A: {type(ops).__name__}.batch_invariant_layer_ops is not declared")
    sizes = rotary_head_sizes(conformance.caps)
    head = 128 if 128 in sizes else sizes[0] if sizes else 64
    for check in layer_op_checks(
        ops,
        invariance.dtype,
        conformance.device,
        invariance.seed,
        head,
        INVARIANCE_NORM_HIDDEN,
        INVARIANCE_SILU_INTERMEDIATE,
        INVARIANCE_ROTARY_HEADS,
        invariance_rotation_sizes(conformance.caps),
    ):
        check.run()


@pytest.mark.paged_cases("batch_invariance_linear")
def test_batch_invariant_linear(conformance: Conformance, invariance_linear: InvarianceLinearCase) -> None:
    """One weight of a declared kind: each row of ``x`` in any call has its bits alone."""
    ops = conformance.fused_ops()
    if invariance_linear.kind not in declared_linear(ops):
        pytest.skip(f"N/A: {invariance_linear.kind} is not in {type(ops).__name__}.batch_invariant_linear")
    check_linear(ops, invariance_linear, conformance.device)


@pytest.mark.paged_capability("capability_check")
def test_batch_invariance_declaration(conformance: Conformance) -> None:
    """``batch_invariant_linear`` is a frozenset of known weight kinds; ``batch_invariant_layer_ops`` a bool."""
    check_declaration(conformance.fused_ops())
