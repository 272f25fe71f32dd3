"""Anthropic's event stream of one message: ``message_start``, ``ping``, per content block ``content_block_start``,
``content_block_delta``s and ``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``.

:class:`MessageEvents` is the sequence as a state machine fed text deltas (no I/O, so it is tested alone); a block
opens with its first non-empty delta, so a response without text has no block, as its non-streamed body has none.
"""

from __future__ import annotations

import json
from typing import Any

from paged_core.serve.anthropic.convert import message_body


def sse_event(data: dict[str, Any]) -> str:
    """One server-sent event named after ``data["type"]``, as Anthropic's clients read them."""
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


class MessageEvents:
    """The events of one streamed message, in order; each method returns the events it adds."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.index = -1
        self.open: str | None = None  # the type of the block being streamed

    def start(self) -> list[dict[str, Any]]:
        """``message_start`` (an empty message with the input usage), then a ``ping``."""
        message = message_body(self.message_id, self.model, [], (None, None), self.input_tokens, 0)
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def text(self, delta: str) -> list[dict[str, Any]]:
        """A ``text_delta``, opening a text block first if none is open."""
        if not delta:
            return []
        events = []
        if self.open != "text":
            events += self._close()
            self.index += 1
            self.open = "text"
            events.append(
                {"type": "content_block_start", "index": self.index, "content_block": {"type": "text", "text": ""}}
            )
        events.append(
            {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": delta}}
        )
        return events

    def finish(self, stop_reason: str, stop_sequence: str | None, output_tokens: int) -> list[dict[str, Any]]:
        """Close the open block, then ``message_delta`` with the stop reason and usage, and ``message_stop``."""
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens},
        }
        return [*self._close(), delta, {"type": "message_stop"}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]
