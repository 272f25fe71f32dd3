"""Fakes whose ``fused_ops()`` are broken in one known way each, plus a correct reimplementation.

Imported by the nested suite runs as ``fused_fakes:ClassName``. Attention is
:class:`~conformance_fakes.GoodFake`'s; only the fused layer ops differ. Each
bug is one that a real kernel port makes: vLLM's in-place conventions, GPT-J
instead of NeoX rotary pairing, a kernel that reads raw storage, and so on.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from conformance_fakes import GoodFake

from paged_core.api import BackendCapabilities, FusedOps, PackedLinear


class FusedFake(GoodFake):
    """GoodFake declaring head sizes 64 and 80 (and ``DTYPES``); its ``fused_ops()`` is an ``OPS()``."""

    OPS: ClassVar[type[FusedOps]] = FusedOps
    DTYPES: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32})

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=cls.DTYPES, block_sizes=(4,), head_sizes=frozenset({64, 80}), gqa_ratios=frozenset({1, 4})
        )

    def fused_ops(self) -> FusedOps:
        return self.OPS()


class FusedFakeBf16(FusedFake):
    """Float32 and bfloat16 declared."""

    DTYPES = frozenset({torch.float32, torch.bfloat16})


# --- a correct implementation that shares no code with the reference -------------------------------------------------


@torch.library.custom_op("paged_conformance_fakes::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _rotate_neox(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    tf = t.float()
    rotated = torch.cat((-tf[..., half:], tf[..., :half]), dim=-1)
    return (tf * torch.cat((cos, cos), -1) + rotated * torch.cat((sin, sin), -1)).to(t.dtype)


def _sylvester(b: int) -> torch.Tensor:
    """``H_b`` from its entries, ``(-1) ** popcount(i & j)``, in float64 (no recursion, no butterfly)."""
    i = torch.arange(b)
    bits, parity = i[:, None] & i[None, :], torch.zeros(b, b, dtype=torch.int64)
    for k in range(max(1, b.bit_length())):
        parity ^= (bits >> k) & 1
    return (1 - 2 * parity).double()


class ReimplementedOps(FusedOps):
    """Correct: a custom op (with a fake) for the norm, other formulas elsewhere, an fp32 transposed weight packed."""

    name = "reimplemented"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.ops.paged_conformance_fakes.rms_norm(x, weight, eps)  # type: ignore[no-any-return]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        summed = torch.add(x, residual)
        return self.rms_norm(summed, weight, eps), summed

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.float().chunk(2, dim=-1)
        return (gate * torch.sigmoid(gate) * up).to(x.dtype)

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos_sin_cache[positions].float()[:, None, :].chunk(2, dim=-1)
        return _rotate_neox(query, cos, sin), _rotate_neox(key, cos, sin)

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        b = d & -d
        blocks = x.double().reshape(*x.shape[:-1], d // b, b)
        return (blocks @ (_sylvester(b) / b**0.5)).reshape(x.shape).to(x.dtype)

    def pack_linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
        return PackedLinear(weight, bias, packed=weight.float().t().contiguous())

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        out = x.float() @ packed.packed
        if packed.bias is not None:
            out = out + packed.bias.float()
        return out.to(x.dtype)


class Reimplemented(FusedFakeBf16):
    OPS = ReimplementedOps


# --- one bug each --------------------------------------------------------------------------------------------------


class EpsOutsideSqrtOps(FusedOps):
    """Bug: ``x / (sqrt(mean(x**2)) + eps)`` (``add_rms_norm`` inherits it through ``self.rms_norm``)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        return (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight.float()).to(x.dtype)


class EpsOutsideSqrt(FusedFake):
    OPS = EpsOutsideSqrtOps


class FixedEpsOps(FusedOps):
    """Bug: ignores the ``eps`` argument and always uses 1e-6 (a model constant baked into a kernel)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return super().rms_norm(x, weight, 1e-6)


class FixedEps(FusedFake):
    OPS = FixedEpsOps


class SwappedGateUpOps(FusedOps):
    """Bug: ``silu(up) * gate``: the halves of the merged projection taken the other way round."""

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return super().silu_and_mul(torch.cat((x[..., half:], x[..., :half]), dim=-1))


class SwappedGateUp(FusedFake):
    OPS = SwappedGateUpOps


class InterleavedRotaryOps(FusedOps):
    """Bug: GPT-J pairing (dimension ``2i`` with ``2i + 1``) instead of NeoX (``i`` with ``i + D/2``)."""

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        half = cos_sin_cache.shape[-1] // 2
        cs = cos_sin_cache.index_select(0, positions).float()
        cos, sin = cs[:, None, :half], cs[:, None, half:]

        def rotate(t: torch.Tensor) -> torch.Tensor:
            tf = t.float()
            a, b = tf[..., 0::2], tf[..., 1::2]
            return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2).to(t.dtype)

        return rotate(query), rotate(key)


class InterleavedRotary(FusedFake):
    OPS = InterleavedRotaryOps


class PowerOfTwoPrefixRotationOps(FusedOps):
    """Bug: one Hadamard block of the largest power of two not above ``D``, the rest left as is (another block rule:
    right at 64, wrong at 80)."""

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        b = 1 << (d.bit_length() - 1)
        head = x.float()[..., :b] @ (_sylvester(b) / b**0.5).float()
        return torch.cat((head, x.float()[..., b:]), dim=-1).to(x.dtype)


class PowerOfTwoPrefixRotation(FusedFake):
    OPS = PowerOfTwoPrefixRotationOps


class RotateHeadsInPlaceOps(FusedOps):
    """Bug: rotates ``x`` in place and returns it (the engine's q, k and v are views of one QKV output)."""

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        x.copy_(super().rotate_heads(x))
        return x


class RotateHeadsInPlace(FusedFake):
    OPS = RotateHeadsInPlaceOps


class LinearIgnoresBiasOps(FusedOps):
    """Bug: ``linear`` drops the bias."""

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        return torch.nn.functional.linear(x, packed.weight)


class LinearIgnoresBias(FusedFake):
    OPS = LinearIgnoresBiasOps


class RotaryInPlaceOps(FusedOps):
    """Bug: rotates ``query`` and ``key`` in place and returns them (vLLM's convention, not this contract's)."""

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().rotary(positions, query, key, cos_sin_cache)
        query.copy_(q)
        key.copy_(k)
        return query, key


class RotaryInPlace(FusedFake):
    OPS = RotaryInPlaceOps


class AddRmsNormInPlaceOps(FusedOps):
    """Bug: stores the sum into ``residual`` and returns it (vLLM's ``fused_add_rms_norm`` convention)."""

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual.add_(x)
        return self.rms_norm(residual, weight, eps), residual


class AddRmsNormInPlace(FusedFake):
    OPS = AddRmsNormInPlaceOps


def _dense(t: torch.Tensor) -> torch.Tensor:
    """What a kernel handed only ``data_ptr()`` and a shape reads: the storage as if ``t`` were contiguous."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.insert(0, step)
        step *= size
    return t.as_strided(t.shape, strides, t.storage_offset())


class IgnoresStridesOps(FusedOps):
    """Bug: every op reads its tensors' storage as if they were contiguous (strides ignored)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return super().rms_norm(_dense(x), _dense(weight), eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().add_rms_norm(_dense(x), _dense(residual), _dense(weight), eps)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return super().silu_and_mul(_dense(x))

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().rotary(_dense(positions), _dense(query), _dense(key), _dense(cos_sin_cache))

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        return super().rotate_heads(_dense(x))

    def pack_linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
        return super().pack_linear(_dense(weight), None if bias is None else _dense(bias))

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        return super().linear(_dense(x), packed)


class IgnoresStrides(FusedFake):
    OPS = IgnoresStridesOps


class ReusesOutputOps(FusedOps):
    """Bug: ``linear`` writes into one output buffer per weight and row count, returned again by the next such call."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[int, int], torch.Tensor] = {}

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        result = super().linear(x, packed)
        out = self.buffers.setdefault((id(packed), x.shape[0]), torch.empty_like(result))
        return out.copy_(result)


class ReusesOutput(FusedFake):
    OPS = ReusesOutputOps


class LinearReturnsFloat32Ops(FusedOps):
    """Bug: ``linear`` returns its float32 accumulator instead of rounding to ``x.dtype``."""

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        bias = None if packed.bias is None else packed.bias.float()
        return torch.nn.functional.linear(x.float(), packed.weight.float(), bias)


class LinearReturnsFloat32(FusedFakeBf16):
    OPS = LinearReturnsFloat32Ops


class HostSyncOps(FusedOps):
    """Bug: ``silu_and_mul`` checks its input for overflow on the host (a sync; a graph break)."""

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x.abs() > 1e4).any()):
            raise ValueError("activation overflow")
        return super().silu_and_mul(x)


class HostSync(FusedFake):
    OPS = HostSyncOps


@torch.library.custom_op("paged_conformance_fakes::rotary_no_fake", mutates_args=())
def _rotary_no_fake(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return FusedOps().rotary(positions, query, key, cos_sin_cache)


class NoFakeKernelOps(FusedOps):
    """Bug: ``rotary`` is a custom op with no fake (meta) implementation, so a compiler cannot trace it."""

    def rotary(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = torch.ops.paged_conformance_fakes.rotary_no_fake(positions, query, key, cos_sin_cache)
        return q, k


class NoFakeKernel(FusedFake):
    OPS = NoFakeKernelOps


class NotFusedOps(FusedFake):
    """Broken hook: ``fused_ops()`` returns an object that is not a :class:`FusedOps`."""

    def fused_ops(self) -> FusedOps:
        return object()  # type: ignore[return-value]
