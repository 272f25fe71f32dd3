"""Fake backends with quantized KV caches for the meta-tests: one correct in the default layout, one correct in a
layout of its own, and others each broken in one known way. Plain loops, so each bug is one obvious line.

Imported by the nested suite runs as ``kv_quant_fakes:ClassName``.
"""

from __future__ import annotations

import torch

from paged_core.api import (
    QUANTIZED_KV_DTYPES,
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    dequantize_kv,
    is_quantized_kv,
    quantize_kv,
)

_FLOATS = frozenset({torch.float32, torch.bfloat16})


class QuantFake(AttentionBackend):
    """Correct: fp32/bf16 compute over fp32, bf16, int8 and fp8 KV caches; head size 64, block size 8, GQA 4."""

    name = "quant-fake"
    api_version = 1

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=_FLOATS,
            kv_cache_dtypes=_FLOATS | frozenset(QUANTIZED_KV_DTYPES),
            block_sizes=(8,),
            head_sizes=frozenset({64}),
            gqa_ratios=frozenset({4}),
        )

    def pack(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """One vector as the cache stores it."""
        return quantize_kv(x, dtype) if is_quantized_kv(dtype) else x.to(dtype)

    def unpack(self, stored: torch.Tensor) -> torch.Tensor:
        """Stored vectors as float32 values."""
        return dequantize_kv(stored) if is_quantized_kv(stored.dtype) else stored.float()

    def at(self, cache: torch.Tensor, part: int, slot: int) -> torch.Tensor:
        """The ``[kv_heads, width]`` view of one slot (keys: part 0, values: part 1)."""
        bs = cache.shape[2]
        return cache[part, slot // bs, slot % bs]

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        for t, slot in enumerate(metadata.slot_mapping.tolist()):
            if slot >= 0:
                self.at(kv_cache, 0, slot).copy_(self.pack(key[t], kv_cache.dtype))
                self.at(kv_cache, 1, slot).copy_(self.pack(value[t], kv_cache.dtype))

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        out = torch.zeros_like(query)
        bs = metadata.block_size
        qsl, lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
        for row, seq_len in enumerate(lens):
            table = metadata.block_table[row].tolist()
            slots = [table[p // bs] * bs + p % bs for p in range(seq_len)]
            keys = torch.stack([self.unpack(self.at(kv_cache, 0, s)) for s in slots])
            values = torch.stack([self.unpack(self.at(kv_cache, 1, s)) for s in slots])
            first = seq_len - (qsl[row + 1] - qsl[row])
            for t in range(qsl[row], qsl[row + 1]):
                visible = first + t - qsl[row] + 1
                for h in range(spec.num_heads):
                    kh = h // spec.gqa_ratio
                    scores = keys[:visible, kh] @ query[t, h].float() * spec.softmax_scale
                    out[t, h] = (scores.softmax(0) @ values[:visible, kh]).to(query.dtype)
        return out

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        for cache in kv_caches:
            for src, dst in src_to_dst.tolist():
                cache[:, dst] = cache[:, src]


class OwnLayoutQuant(QuantFake):
    """Correct, in a layout of its own: ``[2, blocks, kv_heads, block_size, width]`` (heads outermost)."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def at(self, cache: torch.Tensor, part: int, slot: int) -> torch.Tensor:
        bs = cache.shape[3]
        return cache[part, slot // bs, :, slot % bs]


class RoundsTowardZero(QuantFake):
    """Bug: int8 values truncated instead of rounded to nearest (half of them one step off)."""

    def pack(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if dtype != torch.int8:
            return super().pack(x, dtype)
        packed = quantize_kv(x, dtype)
        scale = packed.view(torch.uint8)[..., -2:].contiguous().view(torch.float16).float()
        codes = (x.float() / scale).clamp(-127, 127).trunc().to(torch.int8)
        return torch.cat([codes, packed[..., -2:]], dim=-1)


class WrongScale(OwnLayoutQuant):
    """Bug (in its own layout): scales from max|x| / (QMAX - 1), so the largest element is clamped."""

    def pack(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not is_quantized_kv(dtype):
            return super().pack(x, dtype)
        qmax = QUANTIZED_KV_DTYPES[dtype]
        return quantize_kv(x * (qmax / (qmax - 1)), dtype)  # the same codes with scales 1/(QMAX-1) too large


class IgnoresScales(QuantFake):
    """Bug: attention reads the stored codes as values, never multiplying by the scales."""

    def unpack(self, stored: torch.Tensor) -> torch.Tensor:
        if not is_quantized_kv(stored.dtype):
            return super().unpack(stored)
        return stored[..., :-2].float()
