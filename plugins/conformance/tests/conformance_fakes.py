"""Small fake backends for the meta-tests: one correct, the others each broken in one known way.

Imported by the nested suite runs as ``conformance_fakes:ClassName`` (the
tests put this folder on ``sys.path``). Written as plain loops so each bug
is one obvious line.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from paged_core.api import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    Availability,
    BackendCapabilities,
    EagerStrategy,
    GraphCaptureStrategy,
    GraphSupport,
    StepFn,
)


class GoodFake(AttentionBackend):
    """A correct, tiny backend: fp32, head size 64, block size 4, GQA 1 and 4, no optional features."""

    name = "good-fake"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, device="cpu")

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(dtypes=frozenset({torch.float32}), block_sizes=(4,), head_sizes=frozenset({64}),
                                   gqa_ratios=frozenset({1, 4}))

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

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        bs = kv_cache.shape[2]
        for t, slot in enumerate(metadata.slot_mapping.tolist()):
            if self.slot_ok(slot):
                kv_cache[0, slot // bs, slot % bs] = key[t]
                kv_cache[1, slot // bs, slot % bs] = value[t]

    def attention(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                  spec: AttentionSpec) -> torch.Tensor:
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
                    scores = keys[:, kh] @ query[t, h].float() * spec.softmax_scale
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


class SnapshotStrategy(GraphCaptureStrategy):
    """Bug: copies the static inputs at capture, so replays never see new block tables or lengths."""

    name = "snapshot"

    def __init__(self) -> None:
        self.steps: dict[Hashable, tuple[StepFn, tuple[torch.Tensor, ...]]] = {}

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        self.steps[key] = (fn, tuple(a.clone() for a in args))

    def replay(self, key: Hashable) -> torch.Tensor:
        fn, args = self.steps[key]
        return fn(*args)

    def has(self, key: Hashable) -> bool:
        return key in self.steps

    def reset(self) -> None:
        self.steps.clear()


class GoodGraphFake(GoodFake):
    """Correct, and declares uniform-decode capture (replay is an eager call)."""

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(dtypes=frozenset({torch.float32}), block_sizes=(4,), head_sizes=frozenset({64}),
                                   gqa_ratios=frozenset({1, 4}), graph_support=GraphSupport.UNIFORM_DECODE)

    def graph_strategy(self) -> GraphCaptureStrategy:
        return EagerStrategy()


class StaleGraph(GoodGraphFake):
    """Bug: its capture strategy replays the metadata seen at capture time."""

    def graph_strategy(self) -> GraphCaptureStrategy:
        return SnapshotStrategy()


class ClaimsSlidingWindow(GoodFake):
    """Bug: declares sliding-window support but attends to the whole causal prefix."""

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(dtypes=frozenset({torch.float32}), block_sizes=(4,), head_sizes=frozenset({64}),
                                   gqa_ratios=frozenset({1, 4}), sliding_window=True)

    def visible(self, key_pos: int, query_pos: int, spec: AttentionSpec) -> bool:
        return key_pos <= query_pos
