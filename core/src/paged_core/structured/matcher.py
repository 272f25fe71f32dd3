"""One sequence's place in its grammar: accept tokens, roll back drafts, fork for ``n > 1``, fill its mask row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class GrammarMatcher:
    """A sequence's grammar state over an llguidance ``LLMatcher`` (made by :meth:`.CompiledGrammar.matcher`).

    Tokens go in through :meth:`accept` (all of them or none), drafts are checked with :meth:`validate`
    and undone with :meth:`rollback`; :meth:`fork` copies the state for another sequence of the same request.
    """

    __slots__ = ("_ll", "field")

    def __init__(self, ll_matcher: Any, field: str) -> None:
        self._ll = ll_matcher
        self.field = field
        """The :class:`.StructuredOutputs` field this grammar came from."""

    def accept(self, token_ids: Sequence[int]) -> bool:
        """Consume ``token_ids`` in order; False (and nothing consumed) when the grammar refuses any of them."""
        tokens = list(token_ids)
        taken = int(self._ll.try_consume_tokens(tokens))
        if taken == len(tokens):
            return True
        if taken:
            self._ll.rollback(taken)
        return False

    def validate(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` (a speculative draft) the grammar allows; consumes none."""
        return int(self._ll.validate_tokens(list(token_ids)))

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (a rejected draft's tail)."""
        if num_tokens < 0:
            raise ValueError(f"rollback takes a count >= 0; got {num_tokens}")
        if num_tokens and not self._ll.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._ll.get_error() or 'fewer were accepted'}")

    def fork(self) -> GrammarMatcher:
        """An independent copy of this state (the grammar itself is shared)."""
        return GrammarMatcher(self._ll.deep_copy(), self.field)

    def is_terminated(self) -> bool:
        """True once the grammar ends the output (its end token accepted, or nothing more can follow)."""
        return bool(self._ll.is_stopped())

    def is_accepting(self) -> bool:
        """True when the output so far is complete under the grammar (the end token is allowed now)."""
        return bool(self._ll.is_accepting())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32, contiguous, on the CPU; bit set = allowed)."""
        target = bitmask[row]
        self._ll.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())

    @property
    def ll_matcher(self) -> Any:
        """The llguidance matcher underneath (for batch fills)."""
        return self._ll
