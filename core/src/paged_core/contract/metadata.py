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

Sliding-window layers: the core gives back a block once no query to come can
see it, so a row's table entries for blocks wholly before the window of its
first query of the step may be 0 or stale ids (blocks other requests now
use). A backend never reads keys or values outside a query's window: it
starts its key loop at the window, it does not only mask.

Models mixing attention kinds (e.g. Gemma 2 and 3: sliding and full layers)
have several KV-cache groups, each with its own block table and slot mapping
over the same rows: one metadata instance per group, each serving that
group's layers (the engine runs such models eagerly).

Appended in v1 (defaults keep older constructors valid): ``query_start_loc_cpu``
and ``seq_lens_cpu`` are host copies of those two tensors (the same tensors on
a CPU device) for backends that plan a step on the host, e.g. FlashInfer,
without a device sync; ``uniform_query_len`` is ``q`` when every row has
query length ``q`` (decodes: 1; speculative verification of ``k`` drafts:
``1 + k``), else 0. Rows of query length 1 are the decode rows and come first.

Metadata is read-only for backends: one instance serves every layer of a
step (of a KV-cache group). :class:`~paged_core.contract.metadata_builder.MetadataBuilder` is the
one builder of this contract (the engine and the conformance suite both use
it); it writes into persistent buffers, so an instance is valid until the
next step is built.

Rules for capturable backends (``graph_support`` other than ``never``)
----------------------------------------------------------------------
Tensors are read on the device at replay time; Python ints are frozen when
a step is captured. So for a graph of padded size ``n``:

* ``query_start_loc`` ``[n+1]``, ``seq_lens`` ``[n]``, ``block_table``
  ``[n, max_blocks_per_seq]`` and ``slot_mapping`` ``[n]`` keep these shapes
  and hold the live batch followed by padding. Padding tokens have slot
  ``-1`` and zero inputs; their outputs are discarded.
* ``num_actual_tokens`` is ``n`` (the real count is unknown at capture):
  take shapes from the tensors and treat slot ``-1`` as "not a real token".
* ``max_seq_len`` is the runner's ``max_model_len`` bound, not the batch's.
* ``UNIFORM_DECODE`` graphs: ``num_decodes == num_decode_tokens == n``,
  ``num_prefills == 0``, ``max_query_len == uniform_query_len == 1``; every
  row, padding included, has query length 1 and seq_len >= 1.
* ``ANY`` graphs: one graph per padded token count ``n``, with ``n`` rows.
  The host ints are conservative: ``num_decodes == num_decode_tokens == 0``,
  ``num_prefills == n``, ``max_query_len == n``, ``uniform_query_len == 0``;
  take the general path for every row. Trailing rows may be empty (query
  length 0, seq_len 0) and must get no work.
* Never read a metadata tensor on the host (``.item()``, ``.tolist()``,
  control flow on values), and never read the ``*_cpu`` copies inside the
  step: both would bake capture-time values into the graph. Host planning
  belongs in :meth:`AttentionBackend.prepare`, which the core calls outside
  the graph before every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


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
    query_start_loc_cpu: torch.Tensor | None = None
    """Host copy of ``query_start_loc`` (``None`` only from pre-v1.1 constructors)."""
    seq_lens_cpu: torch.Tensor | None = None
    """Host copy of ``seq_lens``."""
    uniform_query_len: int = 0
    """``q`` when every row has query length ``q``, else 0."""

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
    """Build one step's contract tensors from per-row Python lists (a one-off :class:`MetadataBuilder`).

    Rows must already be ordered decodes first. ``block_tables[b]`` must cover
    ``seq_lens[b]`` tokens. ``max_blocks_per_seq`` fixes the block-table width
    (needed for static graph buffers); by default it is the longest row.
    """
    from paged_core.contract.metadata_builder import MetadataBuilder

    width = max_blocks_per_seq if max_blocks_per_seq is not None else max((len(t) for t in block_tables), default=1)
    builder = MetadataBuilder(
        max_num_reqs=max(len(query_lens), 1),
        max_num_tokens=max(sum(query_lens), 1),
        max_blocks_per_seq=max(width, 1),
        block_size=block_size,
        device=device,
    )
    return builder.build(query_lens, seq_lens, block_tables)
