"""``hermes``: calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen 2.5+).

Text around the blocks is content (whitespace alone between them is not, see :class:`ContentSegments`). A block
whose body is not a JSON call stays in the content as written. A last block left open when the text ends (the
model stopped after the JSON) still counts when its body is a complete call.
"""

from __future__ import annotations

import json

from paged_core.serve.tools.base import (
    StreamDelta,
    ToolCallStream,
    ToolParser,
    call_deltas,
    call_from_json,
    held_prefix,
)
from paged_core.serve.tools.content import ContentSegments

START, END = "<tool_call>", "</tool_call>"


def _parse(body: str) -> tuple[str, str] | None:
    try:
        return call_from_json(json.loads(body))
    except ValueError:  # json.JSONDecodeError, and an integer past Python's digit limit
        return None


class HermesStream(ToolCallStream):
    """Content until ``<tool_call>``; a block is held until ``</tool_call>``, then sent as a call or as text."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._content = ContentSegments()

    def feed(self, text: str) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.feed`."""
        self._buf += text
        out: list[StreamDelta] = []
        while True:
            if self._inside:
                end = self._buf.find(END)
                if end < 0:
                    return out
                out += self._block(self._buf[:end], closed=True)
                self._buf = self._buf[end + len(END) :]
                self._inside = False
            else:
                start = self._buf.find(START)
                if start < 0:
                    keep = held_prefix(self._buf, START)
                    out += self._content.text(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                out += self._content.text(self._buf[:start])
                self._buf = self._buf[start + len(START) :]
                self._inside = True

    def finish(self) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.finish`."""
        out = self._block(self._buf, closed=False) if self._inside else self._content.text(self._buf)
        self._buf, self._inside = "", False
        return out + self._content.finish()

    def _block(self, body: str, closed: bool) -> list[StreamDelta]:
        call = _parse(body)
        if call is None:
            return self._content.text(START + body + (END if closed else ""))
        index = self._content.calls
        self._content.call()
        return call_deltas(index, *call)


class HermesToolParser(ToolParser):
    """See the module docstring."""

    name = "hermes"

    def stream(self) -> HermesStream:
        """See :meth:`ToolParser.stream`."""
        return HermesStream()
