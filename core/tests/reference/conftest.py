"""Helpers for the reference-backend tests: random paged layouts and independent dense oracles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from paged_core.api import AttentionSpec


@dataclass
class PagedBatch:
    """Dense per-row K/V plus where each row lives in the paged cache."""

    keys: list[torch.Tensor]  # per row [seq_len, H_kv, D]
    values: list[torch.Tensor]
    tables: list[list[int]]
    num_blocks: int


def make_batch(
    seq_lens: list[int], spec: AttentionSpec, block_size: int, dtype: torch.dtype, seed: int = 0, spare: int = 3
) -> PagedBatch:
    """Random K/V per row, with block ids drawn shuffled from ``1..`` (block 0 is the null block)."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = 1 + sum(needed) + spare
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, keys, values = [], [], []
    for s, n in zip(seq_lens, needed, strict=True):
        tables.append([ids.pop() for _ in range(n)])
        keys.append(torch.randn(s, spec.num_kv_heads, spec.head_size, generator=gen).to(dtype))
        values.append(torch.randn(s, spec.num_kv_heads, spec.head_size, generator=gen).to(dtype))
    return PagedBatch(keys, values, tables, num_blocks)


def fill_cache(cache: torch.Tensor, batch: PagedBatch, upto: list[int], block_size: int) -> None:
    """Write positions ``0..upto[b]-1`` of each row straight into the cache (not via write_kv)."""
    for b, n in enumerate(upto):
        for pos in range(n):
            block, off = batch.tables[b][pos // block_size], pos % block_size
            cache[0, block, off] = batch.keys[b][pos]
            cache[1, block, off] = batch.values[b][pos]


def sdpa_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Causal attention of the last ``Tq`` positions of a sequence via torch's SDPA (fp32, GQA expanded)."""
    tq, tk = q.shape[0], k.shape[0]
    kx = k.float().repeat_interleave(spec.gqa_ratio, dim=1).transpose(0, 1)
    vx = v.float().repeat_interleave(spec.gqa_ratio, dim=1).transpose(0, 1)
    qpos = torch.arange(tk - tq, tk).unsqueeze(1)
    mask = torch.arange(tk).unsqueeze(0) <= qpos
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), kx, vx, attn_mask=mask, scale=spec.softmax_scale
    )
    return out.transpose(0, 1)


def naive_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Scalar-loop attention straight from AttentionSpec's docstring (soft cap, window, GQA)."""
    tq, tk = q.shape[0], k.shape[0]
    out = torch.zeros(tq, spec.num_heads, spec.head_size)
    for i in range(tq):
        pos = tk - tq + i
        lo = 0 if spec.sliding_window is None else max(0, pos - spec.sliding_window + 1)
        for h in range(spec.num_heads):
            kh = h // spec.gqa_ratio
            scores = []
            for j in range(lo, pos + 1):
                s = float((q[i, h].float() * k[j, kh].float()).sum()) * spec.softmax_scale
                if spec.logits_soft_cap is not None:
                    s = spec.logits_soft_cap * math.tanh(s / spec.logits_soft_cap)
                scores.append(s)
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for w, j in zip(weights, range(lo, pos + 1), strict=True):
                out[i, h] += (w / total) * v[j, kh].float()
    return out


@pytest.fixture
def helpers() -> SimpleNamespace:
    """The helpers above as one fixture (test modules cannot import conftest under importlib mode)."""
    return SimpleNamespace(
        make_batch=make_batch, fill_cache=fill_cache, sdpa_oracle=sdpa_oracle, naive_oracle=naive_oracle
    )
