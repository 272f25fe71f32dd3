"""Fakes for the packed-weight linear checks: a correct kernel of its own, and one planted bug each.

Imported by the nested suite runs as ``linear_fakes:ClassName``. Attention is
:class:`~conformance_fakes.GoodFake`'s. :class:`KernelOps` is correct and
shares no code with :mod:`paged_core.quant`: it unpacks the declared formats
itself at ``pack_linear`` (into a float64 transposed matrix, so it also sums
in another order and more exactly than the reference) and hands the one it
does not declare (``q6_k``, packed by the reference) to ``super().linear``.
Each bug is one a real port makes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from conformance_fakes import GoodFake

from paged_core.api import BackendCapabilities, FusedOps, PackedLinear, QuantizedWeight

DECLARED = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "int8"})


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian fp16 at byte ``at`` of each block, as float64 ``[..., 1]``."""
    lo, hi = blocks[..., at].to(torch.int32), blocks[..., at + 1].to(torch.int32)
    return (lo | (hi << 8)).to(torch.int16).view(torch.float16).double()[..., None]


def _low_then_high(qs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Nibbles of ``[..., 16]`` bytes as 32 values: byte j's low nibble is value j, its high nibble value j + 16."""
    low, high = (qs & 0x0F).double(), (qs >> 4).double()
    if interleaved:  # the bug: value 2j low, 2j + 1 high
        return torch.stack((low, high), dim=-1).flatten(-2)
    return torch.cat((low, high), dim=-1)


def _q4k_scales(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight 6-bit scales and mins from the 12 bytes ``sc`` (int64)."""
    scales, mins = [], []
    for j in range(8):
        if j < 4:
            scales.append(sc[..., j] & 63)
            mins.append(sc[..., j + 4] & 63)
        else:
            scales.append((sc[..., j + 4] & 0x0F) | ((sc[..., j - 4] >> 6) << 4))
            mins.append((sc[..., j + 4] >> 4) | ((sc[..., j] >> 6) << 4))
    return torch.stack(scales, -1).double(), torch.stack(mins, -1).double()


def unpack(w: QuantizedWeight, interleaved: bool = False, keep_min: bool = True) -> torch.Tensor:
    """The float64 weight ``[N, K]`` of a declared format (with the two planted bugs as options)."""
    n, k = w.shape
    name = w.format.name
    if name == "int8":
        assert w.scale is not None
        return w.data.double() * w.scale.double()[:, None]
    b = w.data.reshape(n, k // w.format.block_size, w.format.block_bytes)
    if name == "q4_0":
        values = (_low_then_high(b[..., 2:18], interleaved) - 8) * _half(b, 0)
    elif name == "q4_1":
        values = _low_then_high(b[..., 4:20], interleaved) * _half(b, 0) + (_half(b, 2) if keep_min else 0.0)
    elif name == "q8_0":
        values = b[..., 2:34].contiguous().view(torch.int8).double() * _half(b, 0)
    elif name == "q4_k":
        scales, mins = _q4k_scales(b[..., 4:16].to(torch.int64))
        d, dmin = _half(b, 0), _half(b, 2)
        parts = []
        for chunk in range(4):  # 64 weights per 32 bytes: the low nibbles (sub-block 2c), then the high ones
            qs = b[..., 16 + 32 * chunk : 48 + 32 * chunk]
            for sub, q in ((2 * chunk, qs & 0x0F), (2 * chunk + 1, qs >> 4)):
                parts.append(d * scales[..., sub : sub + 1] * q.double() - dmin * mins[..., sub : sub + 1])
        values = torch.cat(parts, -1)
    else:
        raise NotImplementedError(name)
    return values.reshape(n, k)


class KernelOps(FusedOps):
    """Correct: its own unpacking of the declared formats at load, a float64 product; the rest to the reference."""

    name = "kernel"
    linear_formats: ClassVar[frozenset[str]] = DECLARED
    INTERLEAVED = False
    KEEP_MIN = True

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        if not isinstance(weight, QuantizedWeight):
            return super().pack_linear(weight, bias)
        unpacked = unpack(weight, self.INTERLEAVED, self.KEEP_MIN).t().contiguous()
        return PackedLinear(weight, bias, packed=unpacked)

    def own(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        """The product with a weight this class packed."""
        out = x.double() @ packed.packed
        if packed.bias is not None:
            out = out + packed.bias.double()
        return out.to(x.dtype)

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if packed.packed is None:  # not ours: dense, or a format packed by the reference
            return super().linear(x, packed)
        return self.own(x, packed)


class LinearFake(GoodFake):
    """GoodFake whose ``fused_ops()`` is an ``OPS()``; float32 (``DTYPES``)."""

    OPS: ClassVar[type[FusedOps]] = KernelOps
    DTYPES: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32})

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=cls.DTYPES, block_sizes=(4,), head_sizes=frozenset({64}), gqa_ratios=frozenset({1, 4})
        )

    def fused_ops(self) -> FusedOps:
        return self.OPS()


class Kernel(LinearFake):
    """Correct, at float32."""


class KernelHalf(LinearFake):
    """Correct, at bfloat16 and float16 (both run under ``quick``)."""

    DTYPES = frozenset({torch.bfloat16, torch.float16})


# --- one bug each --------------------------------------------------------------------------------------------------


class NibbleOrderOps(KernelOps):
    """Bug: ``q4_0``/``q4_1`` nibbles read interleaved (value 2j low, 2j + 1 high), not ggml's j and j + 16."""

    INTERLEAVED = True


class NibbleOrder(LinearFake):
    OPS = NibbleOrderOps


class IgnoresQ41MinOps(KernelOps):
    """Bug: ``q4_1``'s per-block minimum ``m`` dropped (``d * q`` only, as for ``q4_0`` without the offset)."""

    KEEP_MIN = False


class IgnoresQ41Min(LinearFake):
    OPS = IgnoresQ41MinOps


class PackedIgnoresBiasOps(KernelOps):
    """Bug: its own product drops the bias (the dense and reference paths keep it)."""

    def own(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        return (x.double() @ packed.packed).to(x.dtype)


class PackedIgnoresBias(LinearFake):
    OPS = PackedIgnoresBiasOps


class ContiguousXOps(KernelOps):
    """Bug: its own product reads ``x``'s storage as if ``x`` were contiguous (a kernel handed ``data_ptr()``)."""

    def own(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        return super().own(x.as_strided(x.shape, (x.shape[1], 1), x.storage_offset()), packed)


class ContiguousX(LinearFake):
    OPS = ContiguousXOps


class RepacksInPlaceOps(KernelOps):
    """Bug: ``pack_linear`` reorders ``q4_0`` nibbles in the bytes it was given (saving memory), then reads them so."""

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        if not isinstance(weight, QuantizedWeight) or weight.format.name != "q4_0":
            return super().pack_linear(weight, bias)
        b = weight.data.view(weight.out_features, -1, 18)
        qs = b[..., 2:18].clone()
        values = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # 32 values in ggml's order
        b[..., 2:18] = values[..., 0::2] | (values[..., 1::2] << 4)  # stored interleaved, in place
        return PackedLinear(weight, bias, packed=unpack(weight, interleaved=True).t().contiguous())


class RepacksInPlace(LinearFake):
    OPS = RepacksInPlaceOps


class RefusesReferencePackedOps(KernelOps):
    """Bug: ``linear`` assumes every packed weight is its own (``packed.packed``), so a reference-packed one fails."""

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if not isinstance(packed.weight, QuantizedWeight):
            return super().linear(x, packed)
        return self.own(x, packed)


class RefusesReferencePacked(LinearFake):
    OPS = RefusesReferencePackedOps


def _rounded_per_block(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """``x`` rounded as the contract's int8 activations are (written here, not imported): per block of 32,
    ``q = round(x * (1 / (max|x| / 127)))`` in float32, returned as ``q * d``."""
    xf = x.float().reshape(*x.shape[:-1], -1, block)
    d = xf.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    return (torch.round(xf * inv) * d).reshape(x.shape)


class Q8KernelOps(KernelOps):
    """Correct: rounds activations to int8 per block for the three formats it declares doing so for."""

    q8_activation_formats: ClassVar[frozenset[str]] = frozenset({"q4_0", "q4_1", "q8_0"})

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if (
            packed.packed is not None
            and isinstance(packed.weight, QuantizedWeight)
            and packed.weight.format.name in self.q8_activation_formats
        ):
            return self.own(_rounded_per_block(x), packed).to(x.dtype)
        return super().linear(x, packed)


class Q8Kernel(LinearFake):
    OPS = Q8KernelOps


class UndeclaredQ8Ops(Q8KernelOps):
    """Bug: rounds activations to int8 without declaring it."""

    q8_activation_formats = frozenset()

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if (
            packed.packed is not None
            and isinstance(packed.weight, QuantizedWeight)
            and packed.weight.format.name in {"q4_0", "q4_1", "q8_0"}
        ):
            return self.own(_rounded_per_block(x), packed).to(x.dtype)
        return super().linear(x, packed)


class UndeclaredQ8(LinearFake):
    OPS = UndeclaredQ8Ops


class Q8PerRowOps(Q8KernelOps):
    """Bug: declares the per-block rounding but rounds each row with one scale (the whole row's max)."""

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if (
            packed.packed is not None
            and isinstance(packed.weight, QuantizedWeight)
            and packed.weight.format.name in self.q8_activation_formats
        ):
            return self.own(_rounded_per_block(x, block=x.shape[-1]), packed).to(x.dtype)
        return KernelOps.linear(self, x, packed)


class Q8PerRow(LinearFake):
    OPS = Q8PerRowOps


class StrayQ8Ops(KernelOps):
    """Bug: declares int8 activations for ``q6_k``, a format it does not multiply itself."""

    q8_activation_formats = frozenset({"q8_0", "q6_k"})


class StrayQ8(LinearFake):
    OPS = StrayQ8Ops


class MisspelledFormatOps(KernelOps):
    """Bug: declares ``Q4_0`` (GGUF's spelling), which names no format, next to ``q8_0``."""

    linear_formats = frozenset({"Q4_0", "q8_0"})


class MisspelledFormat(LinearFake):
    OPS = MisspelledFormatOps


class DenseOnlyOps(FusedOps):
    """Bug: overrides ``pack_linear``/``linear`` for dense weights only. It declares no formats (so the contract
    gives it none), but its ``linear`` never hands the reference's packs to ``super()``."""

    def pack_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> PackedLinear:
        return PackedLinear(weight, bias, packed=weight.t().contiguous())  # type: ignore[union-attr]

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        out = x @ packed.packed
        return out if packed.bias is None else out + packed.bias


class DenseOnly(LinearFake):
    OPS = DenseOnlyOps
