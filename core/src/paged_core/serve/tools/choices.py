"""A chat choice with tool parsing: the message of a whole completion, and the deltas of a streamed one."""

from __future__ import annotations

from typing import Any

from paged_core.serve.tools.base import StreamDelta, ToolCallStream, ToolParser


def finish_reason(reason: str | None, called: bool) -> str | None:
    """``"tool_calls"`` when a completion that stopped by itself made calls; other reasons (``length``) stay."""
    return "tool_calls" if called and reason == "stop" else reason


def tool_message(parser: ToolParser, text: str, parallel: bool) -> dict[str, Any]:
    """The assistant ``message`` of a whole completion; ``parallel`` false keeps only the first call."""
    found = parser.extract(text)
    calls = found.calls if parallel else found.calls[:1]
    message: dict[str, Any] = {"role": "assistant", "content": found.content}
    if calls:
        message["tool_calls"] = [c.to_openai() for c in calls]
    return message


class ChoiceStreams:
    """One :class:`ToolCallStream` per choice index; turns each choice's new text into OpenAI ``delta`` dicts."""

    def __init__(self, parser: ToolParser, parallel: bool) -> None:
        self.parser = parser
        self.parallel = parallel
        self._streams: dict[int, ToolCallStream] = {}
        self.called: set[int] = set()

    def deltas(self, index: int, text: str, finished: bool) -> list[dict[str, Any]]:
        """The deltas ``text`` releases for choice ``index`` (all that is left when ``finished``)."""
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = self.parser.stream()
        pieces = stream.feed(text) if text else []
        if finished:
            pieces += stream.finish()
            del self._streams[index]
        return [d for d in map(self._delta, [index] * len(pieces), pieces) if d is not None]

    def _delta(self, index: int, piece: StreamDelta) -> dict[str, Any] | None:
        if piece.call is None:
            return {"content": piece.content}
        if piece.call.index > 0 and not self.parallel:
            return None
        self.called.add(index)
        return {"tool_calls": [piece.call.to_openai()]}
