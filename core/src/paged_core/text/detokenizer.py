"""Incremental detokenization: text deltas from a growing list of token ids, in O(new tokens) per call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Prompt tokens decoded as left context for the first output tokens, so a
# tokenizer that drops the leading space of a decoded window (SentencePiece)
# renders the first output token as it appears mid-text.
PROMPT_CONTEXT_TOKENS = 5
# A UTF-8 character has at most 4 bytes, so only the last 3 tokens of a window
# can hold the start of a character that later tokens may still complete.
MAX_UNFINISHED_TOKENS = 3
# How far back a split point is looked for when a window ends unfinished.
MAX_SPLIT_SEARCH = 8
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns output token ids into text deltas as they arrive.

    Works with any Hugging Face tokenizer (``PreTrainedTokenizerBase``). The
    detokenizer keeps a small window of ids: *context* tokens (the last ones
    emitted, or the prompt's last few at the start) followed by *pending*
    tokens not yet emitted. Each :meth:`push` decodes only that window and
    emits what the pending tokens add to the context's text, then the emitted
    tokens become the next context. While the window's text ends in U+FFFD (a
    multi-byte character split across byte tokens) nothing is emitted: the
    character comes out once its last byte arrives. If several tokens were
    pushed at once, the complete part before such a tail is emitted at once.
    """

    __slots__ = ("_chunks", "_context_text", "_ids", "_read_offset", "skip_special_tokens", "tokenizer")

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        if not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"tokenizer must be a Hugging Face tokenizer with decode(); got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # ids = context tokens [0, read_offset) + pending tokens [read_offset, len).
        self._ids: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_token_ids else []
        self._read_offset = len(self._ids)
        self._context_text = self._decode(len(self._ids))
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        return "".join(self._chunks)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens pushed whose text is not emitted yet (an unfinished character)."""
        return len(self._ids) - self._read_offset

    def push(self, token_ids: Sequence[int] | int) -> str:
        """Append output tokens; return the text they complete (possibly empty)."""
        new = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if not new:
            return ""
        self._ids.extend(new)
        end = len(self._ids)
        full = self._decode(end)
        if full.endswith(REPLACEMENT):
            split = self._split_point(full)
            if split is None:
                return ""
            end, full = split
        if len(full) <= len(self._context_text):
            if full == self._context_text:
                # The tokens render as nothing (skipped special tokens): no need to decode them again.
                del self._ids[self._read_offset : end]
            return ""
        # Sliced by length, not by prefix: a context ending in U+FFFD that the new
        # tokens complete changes one character into another of the same length.
        delta = full[len(self._context_text) :]
        self._advance(end)
        self._chunks.append(delta)
        return delta

    def flush(self) -> str:
        """Emit what pending tokens render to now, U+FFFD included (the sequence ended mid-character).

        After a flush, :attr:`text` equals ``tokenizer.decode(output_ids)`` for
        byte-level tokenizers even when the output stops inside a character.
        """
        end = len(self._ids)
        if end == self._read_offset:
            return ""
        full = self._decode(end)
        if len(full) <= len(self._context_text):
            return ""
        delta = full[len(self._context_text) :]
        self._advance(end)
        self._chunks.append(delta)
        return delta

    def _split_point(self, full: str) -> tuple[int, str] | None:
        """The longest window prefix whose text is final, when the whole window ends unfinished."""
        n = len(self._ids)
        for end in range(n - 1, max(self._read_offset, n - MAX_SPLIT_SEARCH), -1):
            text = self._decode(end)
            unfinished = text.endswith(REPLACEMENT) and end > n - MAX_UNFINISHED_TOKENS
            # A text that is not a prefix of the whole window's text cut a character in two.
            if not unfinished and len(text) > len(self._context_text) and full.startswith(text):
                return end, text
        return None

    def _advance(self, end: int) -> None:
        """Tokens up to ``end`` are emitted: the newly emitted ones become the context."""
        del self._ids[: self._read_offset]
        self._read_offset = end - self._read_offset
        self._context_text = self._decode(self._read_offset)

    def _decode(self, end: int) -> str:
        """Text of the window's first ``end`` ids."""
        if end <= 0:
            return ""
        text = self.tokenizer.decode(self._ids[:end], skip_special_tokens=self.skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"tokenizer.decode returned {type(text).__name__}, expected str")
        return text
