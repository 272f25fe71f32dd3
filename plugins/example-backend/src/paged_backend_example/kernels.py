"""The example backend's three operations as pure, vectorized torch functions.

Everything here stays on the device: no ``.item()``, ``.tolist()`` or
data-dependent Python branches, so a decode step can be captured in a graph
or compiled with static shapes. A real vendor replaces these bodies with
calls into its own kernels and keeps the signatures.
"""

from __future__ import annotations

import torch


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, kv_heads, head_size]`` at ``slot_mapping``; slots of -1 are left untouched.

    Masking out padding with a boolean index would need its size on the host.
    Instead padding tokens are pointed at slot 0 (in block 0, the null block,
    which no sequence owns) and write back the value already stored there.
    """
    _, num_blocks, block_size, kv_heads, head_size = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, kv_heads, head_size)
    valid = (slot_mapping >= 0)[:, None, None]
    index = torch.where(slot_mapping >= 0, slot_mapping, torch.zeros_like(slot_mapping))
    for plane, new in ((0, key), (1, value)):
        old = flat[plane].index_select(0, index)
        flat[plane].index_copy_(0, index, torch.where(valid, new.to(kv_cache.dtype), old))


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ``query`` ``[T, heads, head_size]`` over each row's blocks.

    Queries are laid out as a ``[rows, max_query_len]`` tile, each row's keys
    are gathered through its block table, masks come from ``seq_lens``, and
    the result is scattered back to token order. Query head ``h`` reads KV
    head ``h // (heads // kv_heads)``. Computes in float32.
    """
    tokens, heads, head_size = query.shape
    _, _, block_size, kv_heads, _ = kv_cache.shape
    rows, width = block_table.shape
    group = heads // kv_heads
    device = query.device
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    lens = seq_lens.long()
    step = torch.arange(max_query_len, device=device)
    # Row b's i-th new token: flattened index and absolute position in its sequence.
    token_of = (starts[:-1, None] + step).clamp(max=tokens - 1)
    position = (lens - q_lens)[:, None] + step
    q = query[token_of].view(rows, max_query_len, kv_heads, group, head_size).float()
    table = block_table.long()
    keys = kv_cache[0][table].reshape(rows, width * block_size, kv_heads, head_size).float()
    values = kv_cache[1][table].reshape(rows, width * block_size, kv_heads, head_size).float()
    scores = torch.einsum("bqkgd,bskd->bkgqs", q, keys) * scale
    key_pos = torch.arange(width * block_size, device=device)
    visible = (key_pos <= position[:, :, None]) & (key_pos < lens[:, None, None])
    # A finite floor instead of -inf: padding rows see no key and must not turn into NaN.
    scores = scores.masked_fill(~visible[:, None, None], torch.finfo(torch.float32).min)
    out = torch.einsum("bkgqs,bskd->bqkgd", scores.softmax(dim=-1), values)
    out = out.reshape(rows, max_query_len, heads, head_size)
    # Back to token order; tokens past the last row (graph padding) read row rows-1 and are discarded.
    token = torch.arange(tokens, device=device)
    row = torch.searchsorted(starts[1:].contiguous(), token, right=True).clamp(max=rows - 1)
    col = (token - starts[row]).clamp(0, max_query_len - 1)
    return out[row, col].to(query.dtype)


def copy_blocks(kv_caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """Copy whole blocks (keys and values) in every layer.

    All sources are read before any destination is written, so the pairs
    must be independent: no destination may also be a source, which holds
    for copy-on-write (destinations are freshly allocated blocks).
    """
    src, dst = src_to_dst[:, 0], src_to_dst[:, 1]
    for cache in kv_caches:
        cache.index_copy_(1, dst, cache.index_select(1, src))
