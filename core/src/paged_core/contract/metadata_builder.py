"""MetadataBuilder: the one builder of the batch contract, writing into buffers allocated once."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain

import torch

from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import PagedError


class MetadataBuilder:
    """Builds each step's :class:`AttentionMetadata` into persistent buffers.

    Buffers are sized at start for ``max_num_reqs`` rows, ``max_num_tokens``
    tokens and ``max_blocks_per_seq`` block-table columns. The host side is
    computed with a handful of vectorised torch ops (no per-token Python) and,
    on an accelerator, copied to device buffers without blocking: pinned
    host buffers are reused every step, which is safe because the engine
    reads each step's results on the host before building the next one.

    A built metadata's tensors are views of these buffers: it is valid until
    the next :meth:`build`. The block table always has the full
    ``max_blocks_per_seq`` width, so its shape is stable across steps.
    :attr:`positions` holds the step's absolute token positions as well.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_tokens: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (
            ("max_num_reqs", max_num_reqs),
            ("max_num_tokens", max_num_tokens),
            ("max_blocks_per_seq", max_blocks_per_seq),
            ("block_size", block_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PagedError(f"{name} must be an int >= 1, got {value!r}")
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self.device = torch.device(device)
        on_host = self.device.type == "cpu"
        pin = not on_host and torch.cuda.is_available()

        def host(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=pin)

        self._qsl = host(max_num_reqs + 1, dtype=torch.int32)
        self._seq_lens = host(max_num_reqs, dtype=torch.int32)
        self._table = host(max_num_reqs, max_blocks_per_seq, dtype=torch.int32)
        self._slots = host(max_num_tokens, dtype=torch.int64)
        self._positions = host(max_num_tokens, dtype=torch.int64)
        self._host = (self._qsl, self._seq_lens, self._table, self._slots, self._positions)
        self._dev = self._host if on_host else tuple(torch.zeros_like(t, device=self.device) for t in self._host)
        self._rows_used = 0
        self.positions = self._dev[4][:0]
        """Absolute positions ``[T]`` (int64, on the device) of the last built step's tokens."""

    def build(
        self,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        *,
        validate: bool = True,
    ) -> AttentionMetadata:
        """The contract for rows given decodes first; ``block_tables[b]`` must cover ``seq_lens[b]`` tokens.

        ``validate=False`` skips the per-row checks (the engine's scheduler
        already guarantees them); shapes against the buffers are always checked.
        """
        n = len(query_lens)
        if len(seq_lens) != n or len(block_tables) != n:
            raise PagedError("query_lens, seq_lens and block_tables must have one entry per row")
        if n > self.max_num_reqs:
            raise PagedError(f"{n} rows exceed max_num_reqs={self.max_num_reqs}")
        qsl = [0, *accumulate(query_lens)]
        tokens = qsl[-1]
        if tokens > self.max_num_tokens:
            raise PagedError(f"{tokens} tokens exceed max_num_tokens={self.max_num_tokens}")
        widths = [len(t) for t in block_tables]
        if max(widths, default=0) > self.max_blocks_per_seq:
            b = max(range(n), key=widths.__getitem__)
            raise PagedError(f"row {b}: {widths[b]} blocks exceed max_blocks_per_seq={self.max_blocks_per_seq}")
        num_decodes = _check_rows(query_lens, seq_lens, widths, self.block_size) if validate else _decodes(query_lens)

        qsl_h, seq_h, table_h, slots_h, pos_h = self._host
        qsl_h[: n + 1] = torch.tensor(qsl, dtype=torch.int32)
        seq_h[:n] = torch.tensor(list(seq_lens), dtype=torch.int32)
        # Clear the rows used last time, then scatter every row's block ids in one indexed write.
        table_h[: max(self._rows_used, n)].zero_()
        self._rows_used = n
        if n:
            lens = torch.tensor(widths, dtype=torch.int64)
            flat = torch.tensor(list(chain.from_iterable(block_tables)), dtype=torch.int32)
            starts = torch.cumsum(lens, 0) - lens
            rows = torch.repeat_interleave(torch.arange(n), lens)
            cols = torch.arange(flat.numel()) - torch.repeat_interleave(starts, lens)
            table_h.view(-1)[rows * self.max_blocks_per_seq + cols] = flat
        if tokens:
            qlens = torch.tensor(list(query_lens), dtype=torch.int64)
            row_of = torch.repeat_interleave(torch.arange(n), qlens)
            first = seq_h[:n].to(torch.int64) - qlens  # position of each row's first new token
            pos = torch.arange(tokens) - qsl_h[:n].to(torch.int64)[row_of] + first[row_of]
            pos_h[:tokens] = pos
            blocks = table_h[row_of, pos // self.block_size].to(torch.int64)
            slots_h[:tokens] = blocks * self.block_size + pos % self.block_size
        if self._dev is not self._host:
            for dst, src, used in zip(self._dev, self._host, (n + 1, n, n, tokens, tokens), strict=True):
                dst[:used].copy_(src[:used], non_blocking=True)
        qsl_d, seq_d, table_d, slots_d, pos_d = self._dev
        self.positions = pos_d[:tokens]
        uniform = query_lens[0] if n and all(q == query_lens[0] for q in query_lens) else 0
        return AttentionMetadata(
            query_start_loc=qsl_d[: n + 1],
            seq_lens=seq_d[:n],
            block_table=table_d[:n],
            slot_mapping=slots_d[:tokens],
            block_size=self.block_size,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            num_prefills=n - num_decodes,
            num_actual_tokens=tokens,
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            query_start_loc_cpu=qsl_h[: n + 1],
            seq_lens_cpu=seq_h[:n],
            uniform_query_len=uniform,
        )


def _decodes(query_lens: Sequence[int]) -> int:
    """Leading rows of query length 1."""
    count = 0
    for q in query_lens:
        if q != 1:
            break
        count += 1
    return count


def _check_rows(query_lens: Sequence[int], seq_lens: Sequence[int], widths: Sequence[int], block_size: int) -> int:
    """Validate every row (lengths, decodes first, blocks cover the sequence); returns the decode count."""
    seen_prefill = False
    num_decodes = 0
    for b, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if q <= 0 or s < q:
            raise PagedError(f"row {b}: need 0 < query_len <= seq_len, got {q} and {s}")
        if widths[b] * block_size < s:
            raise PagedError(f"row {b}: {widths[b]} blocks cannot hold {s} tokens")
        if q == 1:
            if seen_prefill:
                raise PagedError(f"row {b}: decode rows must come before prefill rows")
            num_decodes += 1
        else:
            seen_prefill = True
    return num_decodes
