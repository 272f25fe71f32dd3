"""Small fake backends for the meta-tests: one correct, the others each broken in one known way.

Imported by the nested suite runs as ``conformance_fakes:ClassName`` (the
tests put this folder on ``sys.path``); graph-capturing fakes live in
``graph_fakes``. Written as plain loops so each bug
is one obvious line.
"""

from __future__ import annotations

import torch

from paged_core.api import AttentionBackend, AttentionMetadata, AttentionSpec, Availability, BackendCapabilities


class GoodFake(AttentionBackend):
    """A correct, tiny backend: fp32, head size 64, block size 4, GQA 1 and 4, no optional features."""

    name = "good-fake"
    api_version = 1

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=frozenset({torch.float32}),
            block_sizes=(4,),
            head_sizes=frozenset({64}),
            gqa_ratios=frozenset({1, 4}),
        )

    def slot_ok(self, slot: int) -> bool:
        """Whether a token with this slot is stored (padding is not)."""
        return slot >= 0

    def kv_head(self, head: int, spec: AttentionSpec) -> int:
        """The KV head query head ``head`` reads."""
        return head // spec.gqa_ratio

    def visible(self, key_pos: int, query_pos: int, spec: AttentionSpec) -> bool:
        """Whether the key at ``key_pos`` is visible from ``query_pos``."""
        ok = key_pos <= query_pos
        if spec.sliding_window is not None:
            ok = ok and key_pos > query_pos - spec.sliding_window
        return ok

    def block_row(self, metadata: AttentionMetadata, row: int) -> list[int]:
        """The block table row used for sequence ``row``."""
        return metadata.block_table[row].tolist()

    def scale(self, spec: AttentionSpec) -> float:
        """The softmax scale applied to scores."""
        return spec.softmax_scale

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        bs = kv_cache.shape[2]
        for t, slot in enumerate(metadata.slot_mapping.tolist()):
            if self.slot_ok(slot):
                kv_cache[0, slot // bs, slot % bs] = key[t]
                kv_cache[1, slot // bs, slot % bs] = value[t]

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        out = torch.zeros_like(query)
        bs = metadata.block_size
        qsl, lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
        for row, seq_len in enumerate(lens):
            table = self.block_row(metadata, row)
            slots = [table[p // bs] * bs + p % bs for p in range(seq_len)]
            keys = kv_cache[0].reshape(-1, *kv_cache.shape[3:])[slots].float()
            values = kv_cache[1].reshape(-1, *kv_cache.shape[3:])[slots].float()
            first = seq_len - (qsl[row + 1] - qsl[row])
            for t in range(qsl[row], qsl[row + 1]):
                pos = first + t - qsl[row]
                mask = torch.tensor([self.visible(j, pos, spec) and j < seq_len for j in range(seq_len)])
                for h in range(spec.num_heads):
                    kh = self.kv_head(h, spec)
                    scores = keys[:, kh] @ query[t, h].float() * self.scale(spec)
                    if spec.logits_soft_cap is not None:
                        scores = spec.logits_soft_cap * torch.tanh(scores / spec.logits_soft_cap)
                    probs = scores.masked_fill(~mask, float("-inf")).softmax(0)
                    out[t, h] = (probs @ values[:, kh]).to(query.dtype)
        return out

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
        for cache in kv_caches:
            for src, dst in src_to_dst.tolist():
                cache[:, dst] = cache[:, src]


class WrongBlockIndex(GoodFake):
    """Bug: every row reads through the first row's block table."""

    def block_row(self, metadata: AttentionMetadata, row: int) -> list[int]:
        return metadata.block_table[0].tolist()


class WritesPadding(GoodFake):
    """Bug: stores padding tokens too (slot -1 lands on the cache's last slot)."""

    def slot_ok(self, slot: int) -> bool:
        return True

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        for t, slot in enumerate(metadata.slot_mapping.tolist()):
            flat[0, slot], flat[1, slot] = key[t], value[t]


class OffByOneMask(GoodFake):
    """Bug: a query also sees the key right after it."""

    def visible(self, key_pos: int, query_pos: int, spec: AttentionSpec) -> bool:
        return key_pos <= query_pos + 1


class WrongGqaMapping(GoodFake):
    """Bug: query heads are spread round-robin over KV heads instead of grouped."""

    def kv_head(self, head: int, spec: AttentionSpec) -> int:
        return head % spec.num_kv_heads


class ClaimsSlidingWindow(GoodFake):
    """Bug: declares sliding-window support but attends to the whole causal prefix."""

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=frozenset({torch.float32}),
            block_sizes=(4,),
            head_sizes=frozenset({64}),
            gqa_ratios=frozenset({1, 4}),
            sliding_window=True,
        )

    def visible(self, key_pos: int, query_pos: int, spec: AttentionSpec) -> bool:
        return key_pos <= query_pos


class FirstLayerMemo(GoodFake):
    """Bug: ``prepare`` starts a per-step memo, then every layer attends over the first layer's KV cache."""

    def prepare(self, metadata: AttentionMetadata) -> None:
        self.memo: torch.Tensor | None = None

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        memo = getattr(self, "memo", None)
        if memo is None:
            memo = self.memo = kv_cache.clone()
        return super().attention(query, memo, metadata, spec)


class MutatesSeqLens(GoodFake):
    """Bug: after attending, turns ``metadata.seq_lens`` into context lengths in place."""

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        out = super().attention(query, kv_cache, metadata, spec)
        metadata.seq_lens -= metadata.query_lens().to(metadata.seq_lens.dtype)
        return out


class ManyRowsWrong(GoodFake):
    """Bug: rows from the fifth on read through row 0's block table (a work list sized for four rows)."""

    def block_row(self, metadata: AttentionMetadata, row: int) -> list[int]:
        return metadata.block_table[0 if row >= 4 else row].tolist()


class LongSeqWrong(GoodFake):
    """Bug: a split-K path for positions past 256 loses the first 256-key partition."""

    def visible(self, key_pos: int, query_pos: int, spec: AttentionSpec) -> bool:
        return super().visible(key_pos, query_pos, spec) and (query_pos < 256 or key_pos >= 256)


class IgnoresSpecScale(GoodFake):
    """Bug: always scales by ``head_size ** -0.5``, ignoring an explicit ``spec.scale``."""

    def scale(self, spec: AttentionSpec) -> float:
        return float(spec.head_size**-0.5)


class AvailabilityRaises(GoodFake):
    """Broken packaging: ``availability()`` raises instead of answering."""

    @classmethod
    def availability(cls) -> Availability:
        raise RuntimeError("driver library not found")


class CapabilitiesAsDict(GoodFake):
    """Broken declaration: ``capabilities()`` returns a plain dict."""

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return {"dtypes": ["float32"], "block_sizes": [4]}  # type: ignore[return-value]
