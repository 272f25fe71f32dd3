"""vLLM's ``return_token_ids`` in completion streams: each choice's first chunk names its prompt's token ids, and
every chunk the token ids it adds, so a client can rebuild both without a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TokenIdFields:
    """Adds ``prompt_token_ids`` (a choice's first chunk) and ``token_ids`` (every chunk) to completion chunks.

    ``prompts`` are the request's prompts, each with ``n`` choices (choice ``index`` is of prompt ``index // n``).
    """

    def __init__(self, prompts: Sequence[list[int]], n: int) -> None:
        self.prompts = prompts
        self.n = n
        self._opened: set[int] = set()

    def add(self, body: dict[str, Any], index: int, token_ids: Sequence[int]) -> dict[str, Any]:
        """``body`` (one chunk of choice ``index``) with the fields set; returned for chaining."""
        choice = body["choices"][0]
        if index not in self._opened:
            self._opened.add(index)
            choice["prompt_token_ids"] = self.prompts[index // self.n]
        choice["token_ids"] = list(token_ids)
        return body
