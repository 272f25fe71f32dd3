"""Fakes that declare graph capture: one correct and host-sync free, the others each broken in one way.

Imported by the nested suite runs as ``graph_fakes:ClassName``. The correct
one is vectorized (no ``.tolist()`` or branches on tensor values), because
the suite traces its captured step whole.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from conformance_fakes import GoodFake

from paged_core.api import (
    AttentionMetadata,
    AttentionSpec,
    BackendCapabilities,
    EagerStrategy,
    GraphCaptureStrategy,
    GraphSupport,
    StepFn,
)


class GoodGraphFake(GoodFake):
    """Correct and device-only; declares uniform-decode capture (replay is an eager call)."""

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        return BackendCapabilities(
            dtypes=frozenset({torch.float32}),
            block_sizes=(4,),
            head_sizes=frozenset({64}),
            gqa_ratios=frozenset({1, 4}),
            graph_support=GraphSupport.UNIFORM_DECODE,
        )

    def graph_strategy(self) -> GraphCaptureStrategy:
        return EagerStrategy()

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        slots = metadata.slot_mapping
        keep = (slots >= 0)[:, None, None]
        index = slots.clamp(min=0)  # padding rewrites slot 0 (null block) with what it already holds
        for plane, new in ((0, key), (1, value)):
            flat[plane].index_copy_(0, index, torch.where(keep, new.to(flat.dtype), flat[plane].index_select(0, index)))

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        # Token-major: each token gathers its row's whole block list, then masks by position.
        tokens = query.shape[0]
        qsl, lens = metadata.query_start_loc.long(), metadata.seq_lens.long()
        token = torch.arange(tokens, device=query.device)
        row = torch.searchsorted(qsl[1:].contiguous(), token, right=True).clamp(max=lens.shape[0] - 1)
        position = lens[row] - (qsl[row + 1] - qsl[row]) + (token - qsl[row])
        table = metadata.block_table.long()[row]
        keys = kv_cache[0][table].flatten(1, 2).float().repeat_interleave(spec.gqa_ratio, dim=2)
        values = kv_cache[1][table].flatten(1, 2).float().repeat_interleave(spec.gqa_ratio, dim=2)
        scores = torch.einsum("thd,tshd->ths", query.float(), keys) * self.scale(spec)
        key_pos = torch.arange(keys.shape[1], device=query.device)
        visible = (key_pos <= position[:, None]) & (key_pos < lens[row][:, None])
        scores = scores.masked_fill(~visible[:, None, :], torch.finfo(torch.float32).min)
        return torch.einsum("ths,tshd->thd", scores.softmax(-1), values).to(query.dtype)


class SnapshotStrategy(EagerStrategy):
    """Bug: copies the static inputs at capture, so replays never see new block tables or lengths."""

    name = "snapshot"

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        super().capture(key, fn, tuple(a.clone() for a in args))


class StaleGraph(GoodGraphFake):
    """Bug: its capture strategy replays the metadata seen at capture time."""

    def graph_strategy(self) -> GraphCaptureStrategy:
        return SnapshotStrategy()


class NoStrategyGraph(GoodGraphFake):
    """Bug: declares uniform-decode capture but hands the engine no strategy."""

    def graph_strategy(self) -> GraphCaptureStrategy:
        return None  # type: ignore[return-value]


class HostBranchInGraph(GoodGraphFake):
    """Bug: a Python branch on a device value; a device graph freezes the capture-time outcome."""

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        if int(metadata.seq_lens.max()) > 1_000_000:
            raise RuntimeError("sequence too long")
        return super().attention(query, kv_cache, metadata, spec)


class HostReadInGraph(GoodGraphFake):
    """Bug: copies ``seq_lens`` to the host in the captured step (a sync; dead code to a compiler)."""

    def attention(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, spec: AttentionSpec
    ) -> torch.Tensor:
        self.last_lens = metadata.seq_lens.tolist()
        return super().attention(query, kv_cache, metadata, spec)
