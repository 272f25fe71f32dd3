"""Checks that a step left alone what it must not touch: the metadata and the blocks no row owns.

One :class:`AttentionMetadata` serves every layer of a step, so a backend
that edits it in place (even "restoring" it later) corrupts the next layer
or a concurrent reader; the harness snapshots it and compares after every
call. Blocks no row uses are checked through attention itself, so the
check works whatever the backend's KV-cache layout is.
"""

from __future__ import annotations

import dataclasses

import torch

from paged_core.api import AttentionBackend, AttentionMetadata, AttentionSpec, build_attention_metadata

MetadataSnapshot = dict[str, object]


def snapshot(metadata: AttentionMetadata) -> MetadataSnapshot:
    """A deep copy of every metadata field (tensors cloned)."""
    out: MetadataSnapshot = {}
    for f in dataclasses.fields(metadata):
        value = getattr(metadata, f.name)
        out[f.name] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def assert_unchanged(metadata: AttentionMetadata, before: MetadataSnapshot, when: str) -> None:
    """Fail, naming the field, when ``metadata`` differs from ``before`` in any bit."""
    for name, old in before.items():
        new = getattr(metadata, name)
        if isinstance(old, torch.Tensor):
            same = (
                isinstance(new, torch.Tensor)
                and new.dtype == old.dtype
                and new.shape == old.shape
                and torch.equal(new, old)
            )
        else:
            same = new == old
        if not same:
            raise AssertionError(
                f"{when} modified metadata.{name} (was {_show(old)}, now {_show(new)}); metadata is read-only: "
                "one AttentionMetadata serves every layer of a step"
            )


def _show(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.flatten()[:8].tolist()) + ("..." if value.numel() > 8 else "")
    return repr(value)


def assert_spare_blocks_untouched(
    backend: AttentionBackend,
    caches: list[torch.Tensor],
    spare: list[int],
    block_size: int,
    spec: AttentionSpec,
    dtype: torch.dtype,
) -> None:
    """Attend over ``spare`` blocks (zero-filled, and no row owns them): any nonzero output is a stray write.

    Every key there is visible and softmax weights are positive, so a single
    written value anywhere in those blocks makes the output nonzero.
    """
    if not spare:
        return
    device = backend.device
    md = build_attention_metadata([1], [len(spare) * block_size], [spare], block_size, device)
    query = torch.ones((1, spec.num_heads, spec.head_size), dtype=dtype, device=device)
    backend.prepare(md)
    for layer, cache in enumerate(caches):
        out = backend.attention(query, cache, md, spec)[:1].float()
        stray = int((out != 0).sum())
        if stray:
            raise AssertionError(
                f"layer {layer}: blocks no row uses ({spare}) were written: attention over them reads nonzero "
                f"values ({stray} output elements, max |out| {float(out.abs().nan_to_num(float('inf')).max()):.3g})"
            )
