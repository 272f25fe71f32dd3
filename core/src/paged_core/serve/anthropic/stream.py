"""Anthropic's event stream of one message: ``message_start``, ``ping``, per content block ``content_block_start``,
``content_block_delta``s and ``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``.

:class:`MessageEvents` is the sequence as a state machine fed text deltas, or the pieces a tool-call parser
releases (no I/O, so it is tested alone). A text block opens with its first non-empty delta, so a response
without text has no block, as its non-streamed body has none; a call opens a ``tool_use`` block (its ``input``
empty) whose arguments follow as ``input_json_delta`` events, which Anthropic's clients join and parse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from paged_core.serve.anthropic.convert import message_body
from paged_core.serve.anthropic.tools import tool_use_id
from paged_core.serve.tools.base import StreamDelta


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
        self.called = False
        """Whether a ``tool_use`` block was opened."""

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
            events += self._open({"type": "text", "text": ""})
        events.append(self._delta({"type": "text_delta", "text": delta}))
        return events

    def tool_use(self, call_id: str, name: str) -> list[dict[str, Any]]:
        """A new ``tool_use`` block (closing the open one): its id and name, and an empty input."""
        self.called = True
        return self._open({"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": {}})

    def input_json(self, partial: str) -> list[dict[str, Any]]:
        """More of the open ``tool_use`` block's input, as JSON text."""
        if not partial:
            return []
        if self.open != "tool_use":
            raise RuntimeError("input_json_delta without an open tool_use block")
        return [self._delta({"type": "input_json_delta", "partial_json": partial})]

    def pieces(self, pieces: Sequence[StreamDelta]) -> list[dict[str, Any]]:
        """The events of a tool-call parser's pieces: content as text, each call as a ``tool_use`` block."""
        events = []
        for p in pieces:
            if p.call is None:
                events += self.text(p.content or "")
                continue
            if p.call.id is not None:
                events += self.tool_use(p.call.id, p.call.name or "")
            events += self.input_json(p.call.arguments)
        return events

    def finish(self, stop_reason: str, stop_sequence: str | None, output_tokens: int) -> list[dict[str, Any]]:
        """Close the open block, then ``message_delta`` with the stop reason and usage, and ``message_stop``."""
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens},
        }
        return [*self._close(), delta, {"type": "message_stop"}]

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.index += 1
        self.open = block["type"]
        return [*events, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]
