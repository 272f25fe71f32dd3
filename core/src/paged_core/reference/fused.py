"""ReferenceFusedOps: the reference arithmetic of every fused op, one row at a time (batch-invariant).

:class:`~paged_core.contract.fused_ops.FusedOps` is the oracle: batched torch, exact float32, but
not batch-invariant (torch's matmul changes kernels with the row count, and an elementwise op is
split between threads by its total size; see that module). These ops run the same arithmetic on
each row (token) alone: the row is copied into new memory of its own (so its shape, strides and
alignment are those of a one-row call whatever the batch) and the base class's op is applied to
it, so a row's bits are those of the one-row call, in any batch. A packed weight is dequantized
once per call and each row multiplied by it as :func:`paged_core.quant.reference_linear` does with
one row. Each op is a torch custom op with a fake implementation, so a compiled step treats it as
one opaque call (the row loop never unrolls or specialises on the token count).

It costs a Python loop per row: fine for the tiny models tests run, slow for real prefills, which is
what the reference may be. ``rotate_heads`` needs no loop: it is the fast Walsh-Hadamard butterfly as
elementwise float32 sums, differences and one scaling (:func:`hadamard_butterfly`), each output element
one correctly rounded operation on elements of its own head vector, so its bits cannot depend on the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from paged_core.contract.fused_ops import LINEAR_KINDS, FusedOps, PackedLinear, rotation_block
from paged_core.quant import FORMATS, QuantizedWeight, dequantize

_BASE = FusedOps()


def _row(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of ``t`` as a new contiguous ``[1, ...]`` tensor (memory of its own, fresh and aligned)."""
    return t[i].clone(memory_format=torch.contiguous_format).unsqueeze(0)


def _by_row(fn: Callable[..., tuple[torch.Tensor, ...]], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn`` applied to row ``i`` of every tensor alone, for each ``i``; each of its outputs concatenated."""
    n = tensors[0].shape[0]
    if n == 0:
        return fn(*tensors)
    outs = [fn(*(_row(t, i) for t in tensors)) for i in range(n)]
    return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))


@torch.library.custom_op("paged_reference::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _by_row(lambda r: (_BASE.rms_norm(r, weight, eps),), x)[0]


@_rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("paged_reference::add_rms_norm", mutates_args=())
def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    normed, summed = _by_row(lambda r, s: _BASE.add_rms_norm(r, s, weight, eps), x, residual)
    return normed, summed


@_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("paged_reference::silu_and_mul", mutates_args=())
def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _by_row(lambda r: (_BASE.silu_and_mul(r),), x)[0]


@_silu_and_mul.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("paged_reference::rotary", mutates_args=())
def _rotary(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = _by_row(lambda p, qr, kr: _BASE.rotary(p, qr, kr, cos_sin_cache), positions, query, key)
    return q, k


@_rotary.register_fake
def _(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return query.new_empty(query.shape), key.new_empty(key.shape)


def hadamard_butterfly(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., D]`` times :func:`~paged_core.contract.fused_ops.head_rotation` ``R(D)`` by the fast
    Walsh-Hadamard transform, in float32, rounded once to ``x.dtype``: a new contiguous tensor.

    Within each block of ``b`` values (:func:`~paged_core.contract.fused_ops.rotation_block`), stages
    ``h = 1, 2, 4, ..., b / 2`` replace each pair ``(v[j], v[j + h])`` (``j`` in the first half of its
    ``2h``-wide group) by ``(v[j] + v[j + h], v[j] - v[j + h])``; then every value is multiplied by
    ``float32(1 / sqrt(b))``. The order of these operations is the contract a batch-invariant kernel
    (the cpu backend's) follows to give the same bits.
    """
    d = x.shape[-1]
    b = rotation_block(d)
    v = x.float().reshape(-1, d // b, b)
    h = 1
    while h < b:
        pairs = v.reshape(v.shape[0], d // b, b // (2 * h), 2, h)
        lo, hi = pairs[..., 0, :], pairs[..., 1, :]
        v = torch.stack((lo + hi, lo - hi), dim=-2)
        h *= 2
    return (v.reshape(x.shape) * (1.0 / math.sqrt(b))).to(x.dtype)


@torch.library.custom_op("paged_reference::rotate_heads", mutates_args=())
def _rotate_heads(x: torch.Tensor) -> torch.Tensor:
    return hadamard_butterfly(x)  # a new tensor: the final scaling always allocates one


@_rotate_heads.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("paged_reference::linear", mutates_args=())
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _by_row(lambda r: (torch.nn.functional.linear(r, weight, bias),), x)[0]


@_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("paged_reference::quant_linear", mutates_args=())
def _quant_linear(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fmt: str,
    out_features: int,
    in_features: int,
) -> torch.Tensor:
    w = dequantize(QuantizedWeight(FORMATS[fmt], (out_features, in_features), data, scale))
    b = bias.float() if bias is not None else None
    # reference_linear with one row: x.float() @ w.T + b in float32, rounded once to x.dtype.
    return _by_row(lambda r: (torch.nn.functional.linear(r.float(), w, b).to(x.dtype),), x)[0]


@_quant_linear.register_fake
def _(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fmt: str,
    out_features: int,
    in_features: int,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


class ReferenceFusedOps(FusedOps):
    """The reference backend's layer ops: :class:`FusedOps`' arithmetic on each row alone (see the module).

    Declares batch invariance for every weight kind (packed formats and dense dtypes) and the layer ops;
    multiplies every packed format itself (as the base class does, by dequantizing exactly in float32).
    """

    name = "reference"
    linear_formats = frozenset(FORMATS)
    batch_invariant_linear = frozenset(LINEAR_KINDS)
    batch_invariant_layer_ops = True

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """:meth:`FusedOps.rms_norm` of each row alone."""
        out: torch.Tensor = torch.ops.paged_reference.rms_norm(x, weight, float(eps))
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`FusedOps.add_rms_norm` of each row alone."""
        normed, summed = torch.ops.paged_reference.add_rms_norm(x, residual, weight, float(eps))
        return normed, summed

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`FusedOps.silu_and_mul` of each row alone."""
        out: torch.Tensor = torch.ops.paged_reference.silu_and_mul(x)
        return out

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`FusedOps.rotary` of each token alone."""
        q, k = torch.ops.paged_reference.rotary(positions, query, key, cos_sin_cache)
        return q, k

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`FusedOps.rotate_heads` by the butterfly (:func:`hadamard_butterfly`): batch-invariant by
        construction, and within float32 rounding of the base class's matmul."""
        out: torch.Tensor = torch.ops.paged_reference.rotate_heads(x)
        return out

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        """``x @ weight.T + bias`` row by row: a packed weight dequantized exactly (float32, then rounded once to
        ``x.dtype``, as :func:`paged_core.quant.reference_linear`), a dense one in ``x.dtype``."""
        w = packed.weight
        flat = x.reshape(-1, x.shape[-1])
        if isinstance(w, QuantizedWeight):
            out: torch.Tensor = torch.ops.paged_reference.quant_linear(
                flat, w.data, w.scale, packed.bias, w.format.name, w.out_features, w.in_features
            )
        else:
            out = torch.ops.paged_reference.linear(flat, w, packed.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])
