"""A chat choice with tool parsing: the calls of a whole completion, and the pieces of a streamed one.

Shared by the chat route (OpenAI's ``message.tool_calls`` and streamed ``delta.tool_calls``) and Anthropic's
Messages route (``tool_use`` blocks and ``input_json_delta`` events): both keep only the first call when parallel
calls are off, and both report a completion that stopped by itself after a call as a tool-call stop.
"""

from __future__ import annotations

from typing import Any

from paged_core.serve.tools.base import ExtractedToolCalls, StreamDelta, ToolCallStream, ToolParser


def finish_reason(reason: str | None, called: bool) -> str | None:
    """``"tool_calls"`` when a completion that stopped by itself made calls; other reasons (``length``) stay."""
    return "tool_calls" if called and reason == "stop" else reason


def extract_calls(parser: ToolParser, text: str, parallel: bool) -> ExtractedToolCalls:
    """The content and calls of a whole completion; ``parallel`` false keeps only the first call."""
    found = parser.extract(text)
    return found if parallel else ExtractedToolCalls(found.content, found.calls[:1])


def tool_message(parser: ToolParser, text: str, parallel: bool) -> dict[str, Any]:
    """The OpenAI assistant ``message`` of a whole completion."""
    found = extract_calls(parser, text, parallel)
    message: dict[str, Any] = {"role": "assistant", "content": found.content}
    if found.calls:
        message["tool_calls"] = [c.to_openai() for c in found.calls]
    return message


class ChoiceStreams:
    """One :class:`ToolCallStream` per choice index; turns each choice's new text into parsed pieces."""

    def __init__(self, parser: ToolParser, parallel: bool) -> None:
        self.parser = parser
        self.parallel = parallel
        self._streams: dict[int, ToolCallStream] = {}
        self.called: set[int] = set()
        """The choices that made at least one call so far."""

    def pieces(self, index: int, text: str, finished: bool) -> list[StreamDelta]:
        """The pieces ``text`` releases for choice ``index`` (all that is left when ``finished``); calls after
        the first are dropped when parallel calls are off."""
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = self.parser.stream()
        pieces = stream.feed(text) if text else []
        if finished:
            pieces += stream.finish()
            del self._streams[index]
        kept = [p for p in pieces if p.call is None or self.parallel or p.call.index == 0]
        if any(p.call is not None for p in kept):
            self.called.add(index)
        return kept

    def deltas(self, index: int, text: str, finished: bool) -> list[dict[str, Any]]:
        """The pieces of :meth:`pieces` as OpenAI ``delta`` dicts."""
        return [
            {"content": p.content} if p.call is None else {"tool_calls": [p.call.to_openai()]}
            for p in self.pieces(index, text, finished)
        ]
