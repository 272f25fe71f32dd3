"""``llama3_json``: Llama 3.x's JSON calls, ``{"name": ..., "parameters"|"arguments": {...}}``.

The text is calls when it starts (after whitespace) with ``{`` or ``<|python_tag|>``; several calls are
separated by ``;`` (or whitespace). Anything else is content: text that does not open with a call is content
whole, and from the first object that is not a complete call, the rest of the text (with the separators or tag
before it, and everything before it when no call came first) is content.
"""

from __future__ import annotations

import json
from enum import Enum

from paged_core.serve.tools.base import StreamDelta, ToolCallStream, ToolParser, call_deltas, call_from_json

TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"
_DECODER = json.JSONDecoder()


class _State(Enum):
    LEAD = "lead"  # nothing but whitespace (or part of the tag) yet
    CALLS = "calls"
    CONTENT = "content"


class Llama3JsonStream(ToolCallStream):
    """Each JSON object is held until it closes (an object's end is final, so a prefix decides it), then sent."""

    def __init__(self) -> None:
        self._state = _State.LEAD
        self._buf = ""
        self._skipped = ""  # tag and separators consumed since the last call: content if a non-call follows
        self._calls = 0

    def feed(self, text: str) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.feed`."""
        self._buf += text
        if self._state is _State.LEAD:
            lead = self._buf.lstrip()
            if not lead or (TAG.startswith(lead) and lead != TAG):
                return []
            if lead.startswith(TAG):
                cut = len(self._buf) - len(lead) + len(TAG)
                self._skipped, self._buf = self._buf[:cut], self._buf[cut:]
                self._state = _State.CALLS
            elif lead.startswith("{"):
                self._state = _State.CALLS
            else:
                self._state = _State.CONTENT
        if self._state is _State.CONTENT:
            out, self._buf = self._buf, ""
            return [StreamDelta(content=out)] if out else []
        return self._calls_in_buffer()

    def _calls_in_buffer(self) -> list[StreamDelta]:
        out: list[StreamDelta] = []
        while True:
            rest = self._buf.lstrip(_SEPARATORS)
            self._skipped += self._buf[: len(self._buf) - len(rest)]
            self._buf = rest
            if not rest:
                return out
            if not rest.startswith("{"):
                return out + self._to_content()
            try:
                value, end = _DECODER.raw_decode(rest)
            except ValueError:  # not closed yet, or malformed: only the end of the text can tell
                return out
            call = call_from_json(value)
            if call is None:
                return out + self._to_content()
            out += call_deltas(self._calls, *call)
            self._calls += 1
            self._buf, self._skipped = rest[end:], ""

    def _to_content(self) -> list[StreamDelta]:
        self._state = _State.CONTENT
        out, self._buf, self._skipped = self._skipped + self._buf, "", ""
        return [StreamDelta(content=out)] if out else []

    def finish(self) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.finish`."""
        if self._buf or self._calls == 0:
            return self._to_content()
        return []


class Llama3JsonToolParser(ToolParser):
    """See the module docstring."""

    name = "llama3_json"

    def stream(self) -> Llama3JsonStream:
        """See :meth:`ToolParser.stream`."""
        return Llama3JsonStream()
