"""The per-step batch contract every backend receives (plugin API v1, frozen).

A step's batch is ``B`` sequences flattened into ``T`` tokens. Rows are ordered
decodes first (query length 1), then prefills (query length > 1, possibly with
earlier tokens already cached). All tensors live on the backend's device.

=================  =============  ==============================================
field              dtype, shape   meaning
=================  =============  ==============================================
query_start_loc    int32 [B+1]    row ``b``'s new tokens are ``[qsl[b], qsl[b+1])``
seq_lens           int32 [B]      tokens in the KV cache after this step (cached + new)
block_table        int32 [B, M]   block ids of each row; unused entries are 0 (the null block)
slot_mapping       int64 [T]      ``block_id * block_size + offset`` per token; ``-1`` = padding, never written
=================  =============  ==============================================

Token ``t`` of row ``b`` sits at absolute position
``seq_lens[b] - query_len[b] + (t - qsl[b])`` and attends causally to every
cached or new key at a position ``<=`` its own (and inside the sliding window).

Metadata is read-only for backends: one instance serves every layer of a
step. Under graph capture (see :mod:`paged_core.graph.runner` for the full
rules) the tensors keep the captured shapes and hold the live batch followed
by padding, while the Python ints are frozen at capture time:
``num_actual_tokens`` then equals the padded token count, padding tokens
carry slot ``-1``, and for ``GraphSupport.ANY`` trailing rows may be empty
(query length 0, seq_len 0) and must get no work. A capturable backend
therefore takes shapes from the tensors, never reads metadata tensors on the
host, and treats slot ``-1`` as "not a real token".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_core.errors import PagedError


@dataclass
class AttentionMetadata:
    """One step's batch, as described in the module docstring.

    Eagerly, ``num_actual_tokens`` is the real token count and tokens at
    ``[num_actual_tokens, T)`` (if any) are padding with ``slot_mapping == -1``
    whose outputs are discarded. Inside a captured graph it is frozen to the
    padded count (see the module docstring).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return self.num_decodes + self.num_prefills

    @property
    def num_tokens(self) -> int:
        """Rows of the token tensors, padding included."""
        return int(self.slot_mapping.shape[0])

    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]

    def context_lens(self) -> torch.Tensor:
        """Tokens already cached before this step, per row."""
        return self.seq_lens - self.query_lens()


def build_attention_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    max_blocks_per_seq: int | None = None,
) -> AttentionMetadata:
    """Build the contract tensors from per-row Python lists.

    Rows must already be ordered decodes first. ``block_tables[b]`` must cover
    ``seq_lens[b]`` tokens. ``max_blocks_per_seq`` fixes the block-table width
    (needed for static graph buffers); by default it is the longest row.
    """
    n = len(query_lens)
    if len(seq_lens) != n or len(block_tables) != n:
        raise PagedError("query_lens, seq_lens and block_tables must have one entry per row")
    seen_prefill = False
    num_decodes = 0
    for b, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if q <= 0 or s < q:
            raise PagedError(f"row {b}: need 0 < query_len <= seq_len, got {q} and {s}")
        if len(block_tables[b]) * block_size < s:
            raise PagedError(f"row {b}: {len(block_tables[b])} blocks cannot hold {s} tokens")
        if q == 1:
            if seen_prefill:
                raise PagedError(f"row {b}: decode rows must come before prefill rows")
            num_decodes += 1
        else:
            seen_prefill = True
    width = max_blocks_per_seq if max_blocks_per_seq is not None else max((len(t) for t in block_tables), default=1)
    width = max(width, 1)
    table = torch.zeros((n, width), dtype=torch.int32)
    slots: list[int] = []
    for b, blocks in enumerate(block_tables):
        if len(blocks) > width:
            raise PagedError(f"row {b}: {len(blocks)} blocks exceed max_blocks_per_seq={width}")
        table[b, : len(blocks)] = torch.tensor(list(blocks), dtype=torch.int32)
        for pos in range(seq_lens[b] - query_lens[b], seq_lens[b]):
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    dev = torch.device(device)
    return AttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=dev),
        block_table=table.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        block_size=block_size,
        num_decodes=num_decodes,
        num_decode_tokens=num_decodes,
        num_prefills=n - num_decodes,
        num_actual_tokens=qsl[-1],
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )
