"""Static buffers a captured step reads, and how a batch is copied (and padded) into them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from paged_core.contract.metadata import AttentionMetadata
from paged_core.errors import ConfigError

NUM_METADATA_ARGS = 4
"""Leading step arguments: query_start_loc, seq_lens, block_table, slot_mapping."""


@dataclass(frozen=True)
class StaticInput:
    """An extra per-token step input: ``[tokens, *shape]`` of ``dtype`` (e.g. query, input_ids)."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ConfigError(f"static input name must be an identifier, got {self.name!r}")
        if any(d <= 0 for d in self.shape):
            raise ConfigError(f"static input {self.name!r} has a non-positive dimension in {self.shape}")


class StaticBatch:
    """Buffers sized for ``max_tokens`` tokens (and as many rows); captured steps see views of them.

    A graph keyed by size ``n`` reads the first ``n`` tokens and ``n`` rows.
    Filling puts the real rows first, then padding: each padding token gets
    its own padding row (query length 1, seq_len 1, block-table row of null
    block 0, slot -1, zero inputs); rows left over after that (only possible
    when a real row has several tokens) are empty (query length 0, seq_len 0).
    """

    def __init__(
        self,
        max_tokens: int,
        max_blocks_per_seq: int,
        inputs: Sequence[StaticInput],
        device: torch.device,
    ) -> None:
        names = [i.name for i in inputs]
        if len(set(names)) != len(names):
            raise ConfigError(f"static input names must be unique, got {names}")
        self.max_tokens = max_tokens
        self.max_blocks_per_seq = max_blocks_per_seq
        self.inputs = tuple(inputs)
        self.query_start_loc = torch.zeros(max_tokens + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(max_tokens, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.extras = {i.name: torch.zeros(max_tokens, *i.shape, dtype=i.dtype, device=device) for i in inputs}
        self._steps = torch.arange(max_tokens + 1, dtype=torch.int32, device=device)

    def args(self, n: int) -> tuple[torch.Tensor, ...]:
        """The views a size-``n`` graph reads, in step-argument order (metadata tensors, then extras)."""
        views = (self.query_start_loc[: n + 1], self.seq_lens[:n], self.block_table[:n], self.slot_mapping[:n])
        return views + tuple(self.extras[i.name][:n] for i in self.inputs)

    def fill_padding(self, n: int) -> None:
        """Make the first ``n`` tokens an all-padding batch (used for warm-up and capture: writes nothing)."""
        self.query_start_loc[0] = 0
        self._pad(n, rows=0, tokens=0)

    def fill(self, n: int, metadata: AttentionMetadata, inputs: Mapping[str, torch.Tensor]) -> None:
        """Copy ``metadata``'s real rows and tokens and ``inputs`` into the buffers, then pad up to ``n``."""
        rows, tokens = metadata.num_reqs, metadata.num_actual_tokens
        width = metadata.block_table.shape[1]
        if set(inputs) != set(self.extras):
            raise ConfigError(f"step inputs {sorted(inputs)} do not match the static inputs {sorted(self.extras)}")
        for spec in self.inputs:
            given = inputs[spec.name]
            if tuple(given.shape[1:]) != spec.shape or given.shape[0] < tokens:
                raise ConfigError(
                    f"input {spec.name!r} has shape {tuple(given.shape)}, expected [>= {tokens}, *{list(spec.shape)}]"
                )
            self.extras[spec.name][:tokens].copy_(given[:tokens])
        self.query_start_loc[: rows + 1].copy_(metadata.query_start_loc[: rows + 1])
        self.seq_lens[:rows].copy_(metadata.seq_lens[:rows])
        self.block_table[:rows, :width].copy_(metadata.block_table[:rows])
        self.block_table[:rows, width:].zero_()
        self.slot_mapping[:tokens].copy_(metadata.slot_mapping[:tokens])
        self._pad(n, rows, tokens)

    def _pad(self, n: int, rows: int, tokens: int) -> None:
        """Pad rows ``[rows, n)`` and tokens ``[tokens, n)`` as the class docstring describes."""
        pad_tokens = n - tokens
        token_rows_end = rows + pad_tokens  # rows [rows, token_rows_end) hold one padding token each
        self.query_start_loc[rows + 1 : token_rows_end + 1].copy_(self._steps[1 : pad_tokens + 1] + tokens)
        self.query_start_loc[token_rows_end + 1 : n + 1] = n
        self.seq_lens[rows:token_rows_end] = 1
        self.seq_lens[token_rows_end:n] = 0
        self.block_table[rows:n].zero_()
        self.slot_mapping[tokens:n] = -1
        for buf in self.extras.values():
            buf[tokens:n].zero_()
