"""Fakes for the batch-invariance checks: the reference with one batch-dependent kernel each, still declaring it.

Imported by the nested suite runs as ``invariance_fakes:ClassName``. Each keeps the reference backend's
declarations (``batch_invariant`` attention, every linear kind, the layer ops) and makes one part depend on
the batch the way real kernels do: a key-split count chosen by the number of rows (flash decoding sized for
occupancy), a rounding rule that changes with the row count (the int8 path for few rows only), a reduction
that takes another order above some rows. Each result is close to the right one; only its bits move.
"""

from __future__ import annotations

import dataclasses

import torch

from paged_core.api import (
    LINEAR_KINDS,
    AttentionMetadata,
    AttentionSpec,
    BackendCapabilities,
    FusedOps,
    PackedLinear,
    QuantizedWeight,
)
from paged_core.testing import ReferenceBackend, ReferenceFusedOps, dequantize


class SplitByBatch(ReferenceBackend):
    """Attention that splits each query's keys into as many parts as the step has rows (up to 4), merged by
    their log-sum-exp: one row alone is one part, the same row in a batch is summed in another order."""

    name = "split-by-batch"

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        """The reference's, but float KV caches only (this attention reads no quantized cache)."""
        caps = ReferenceBackend.capabilities()
        return dataclasses.replace(caps, kv_cache_dtypes=caps.dtypes)

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        parts = min(4, int(metadata.seq_lens.shape[0]))
        out = torch.zeros_like(query)
        qsl, seq_lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
        bs = metadata.block_size
        for b, seq_len in enumerate(seq_lens):
            blocks = metadata.block_table[b, : -(-seq_len // bs)].long()
            keys = kv_cache[0, blocks].reshape(-1, spec.num_kv_heads, spec.head_size)[:seq_len].float()
            values = kv_cache[1, blocks].reshape(-1, spec.num_kv_heads, spec.head_size)[:seq_len].float()
            keys = keys.repeat_interleave(spec.gqa_ratio, dim=1)
            values = values.repeat_interleave(spec.gqa_ratio, dim=1)
            first = seq_len - (qsl[b + 1] - qsl[b])
            for t in range(qsl[b], qsl[b + 1]):
                pos = first + t - qsl[b]
                q = query[t].float()
                stats = []
                for span in torch.arange(pos + 1).tensor_split(parts):
                    if span.numel() == 0:
                        continue
                    scores = torch.einsum("hd,khd->hk", q, keys[span]) * spec.softmax_scale
                    m = scores.amax(-1, keepdim=True)
                    e = (scores - m).exp()
                    stats.append((m, e.sum(-1, keepdim=True), torch.einsum("hk,khd->hd", e, values[span])))
                top = torch.stack([m for m, _, _ in stats]).amax(0)
                total = sum(s * (m - top).exp() for m, s, _ in stats)
                acc = sum(o * (m - top).exp() for m, _, o in stats)
                out[t] = (acc / total).to(query.dtype)
        return out


class RoundsByRowCount(ReferenceFusedOps):
    """The reference row by row up to 4 rows; above, one float64 product per call rounded to ``x.dtype`` (the
    old split: the rounding rule changed with the number of rows)."""

    batch_invariant_linear = frozenset(LINEAR_KINDS)

    def linear(self, x: torch.Tensor, packed: PackedLinear) -> torch.Tensor:
        if x.shape[0] <= 4:
            return super().linear(x, packed)
        w = dequantize(packed.weight) if isinstance(packed.weight, QuantizedWeight) else packed.weight
        out = x.double() @ w.double().T
        if packed.bias is not None:
            out = out + packed.bias.double()
        return out.to(x.dtype)


class NormOrderByRowCount(ReferenceFusedOps):
    """``rms_norm`` as the reference, except that above 8 rows its mean of squares is summed in float64."""

    batch_invariant_layer_ops = True

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.shape[0] <= 8:
            return super().rms_norm(x, weight, eps)
        xf = x.float()
        mean = xf.double().pow(2).mean(-1, keepdim=True).float()
        return (xf * torch.rsqrt(mean + eps) * weight.float()).to(x.dtype)


class RotationByRowCount(ReferenceFusedOps):
    """``rotate_heads`` by the reference's butterfly up to 8 rows; above, by the base class's float32 product with
    ``R`` (sums in another order, as a kernel that switches to a GEMM for large batches)."""

    batch_invariant_layer_ops = True

    def rotate_heads(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= 8:
            return super().rotate_heads(x)
        return FusedOps.rotate_heads(self, x)


class VariantLinear(ReferenceBackend):
    """The reference, with :class:`RoundsByRowCount` as its layer ops."""

    name = "variant-linear"

    def fused_ops(self) -> FusedOps:
        return RoundsByRowCount()


class VariantNorm(ReferenceBackend):
    """The reference, with :class:`NormOrderByRowCount` as its layer ops."""

    name = "variant-norm"

    def fused_ops(self) -> FusedOps:
        return NormOrderByRowCount()


class VariantRotation(ReferenceBackend):
    """The reference, with :class:`RotationByRowCount` as its layer ops."""

    name = "variant-rotation"

    def fused_ops(self) -> FusedOps:
        return RotationByRowCount()


class MisnamedKinds(ReferenceBackend):
    """Declares ``"Q4_0"`` and ``"bf16"``, names no kind of the contract's (the declaration check fails them)."""

    name = "misnamed-kinds"

    def fused_ops(self) -> FusedOps:
        class Misnamed(ReferenceFusedOps):
            batch_invariant_linear = frozenset({"Q4_0", "bf16"})

        return Misnamed()
