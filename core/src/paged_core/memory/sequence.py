"""What the KV cache reads of a request: its id, its tokens, how far its KV is computed, what keys its blocks.

The scheduler's :class:`~paged_core.sched.request.Request` is one; the cache names only these fields, so
memory sits below the scheduler and never imports it.
"""

from __future__ import annotations

from typing import Any, Protocol


class CachedSequence(Protocol):
    """A token sequence holding KV blocks (read-only to the cache, except that it extends ``block_hashes``)."""

    @property
    def request_id(self) -> str:
        """The key of the sequence's block list."""
        ...

    @property
    def all_token_ids(self) -> list[int]:
        """Every known token id, prompt then output."""
        ...

    @property
    def num_tokens(self) -> int:
        """``len(all_token_ids)``."""
        ...

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is (or, once the scheduled step runs, will be) in the cache."""
        ...

    @property
    def num_preemptions(self) -> int:
        """How often the sequence lost its blocks (a preempted one's prefix hit is counted apart)."""
        ...

    @property
    def block_hashes(self) -> list[bytes]:
        """Hashes of the sequence's full blocks so far; the cache appends to this list."""
        ...

    @property
    def cache_salt(self) -> str | None:
        """Mixed into every block hash: sequences with different salts never share blocks."""
        ...

    @property
    def lora_id(self) -> int | str | None:
        """The adapter the KV was computed under (part of the block hash)."""
        ...

    @property
    def extra_keys(self) -> tuple[Any, ...]:
        """Further keys mixed into every block hash."""
        ...
