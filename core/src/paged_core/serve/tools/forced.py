"""``tool_choice`` ``"required"`` and a named function: calls the grammar forces, so any model returns valid ones.

- named: the output is constrained to the function's ``parameters`` schema, so the whole text is the arguments
  object of one call to that function (:class:`NamedToolParser`);
- required: the output is constrained to a JSON array (at least one item, at most one without
  ``parallel_tool_calls``) of ``{"name": <a tool's name>, "parameters": <that tool's schema>}`` (``anyOf`` per
  tool), each element one call (:class:`RequiredToolParser`).

The schemas (:func:`forced_schema`) become the request's ``structured_outputs.json``; the parsers read the
constrained text back as OpenAI's ``tool_calls``, whole and streamed, under the same contract as the format
parsers (the joined deltas equal :meth:`~.ToolParser.extract`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from paged_core.serve.tools.base import StreamDelta, ToolCallDelta, ToolCallStream, ToolParser, call_deltas, new_call_id
from paged_core.serve.tools.request import Tool

ANY_OBJECT: dict[str, Any] = {"type": "object"}
"""The arguments schema of a function that declares no ``parameters``."""
_DECODER = json.JSONDecoder()
_BLANKS = " \t\r\n"


def parameters_schema(tool: Tool) -> dict[str, Any]:
    """The schema of ``tool``'s arguments (any object when it declares none)."""
    return tool.function.parameters if tool.function.parameters is not None else ANY_OBJECT


def required_schema(tools: Sequence[Tool], parallel: bool) -> dict[str, Any]:
    """The schema of a ``required`` output: an array of ``{"name", "parameters"}`` calls, one branch per tool."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": parameters_schema(t)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


class NamedToolStream(ToolCallStream):
    """Every piece of text is more of the one call's arguments; the header goes out with the first piece."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._started = False

    def feed(self, text: str) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.feed`."""
        out = self._header() if not self._started else []
        return [*out, StreamDelta(call=ToolCallDelta(0, arguments=text))] if text else out

    def finish(self) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.finish` (a call even for an empty text: the client asked for one)."""
        return self._header() if not self._started else []

    def _header(self) -> list[StreamDelta]:
        self._started = True
        return [StreamDelta(call=ToolCallDelta(0, id=new_call_id(), name=self._name))]


class NamedToolParser(ToolParser):
    """The parser of a named ``tool_choice``: the whole text is the named function's arguments."""

    name = "named"

    def __init__(self, function: str, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        self.function = function

    def stream(self) -> NamedToolStream:
        """See :meth:`ToolParser.stream`."""
        return NamedToolStream(self.function)


class RequiredToolStream(ToolCallStream):
    """Reads ``[{"name": ..., "parameters": {...}}, ...]``: each element goes out once it closes.

    Text that is not (yet) such an array, e.g. an array cut by ``max_tokens``, comes out as content at the end.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._opened = False
        self._closed = False
        self._calls = 0
        self._seen = ""  # the text consumed since the last call: content if the array never completes

    def feed(self, text: str) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.feed`."""
        self._buf += text
        out: list[StreamDelta] = []
        while not self._closed:
            rest = self._buf.lstrip(_BLANKS + ("," if self._opened and self._calls else ""))
            self._seen += self._buf[: len(self._buf) - len(rest)]
            self._buf = rest
            if not rest:
                return out
            if not self._opened:
                if not rest.startswith("["):
                    return out
                self._opened, self._buf, self._seen = True, rest[1:], self._seen + "["
                continue
            if rest.startswith("]"):
                self._closed, self._buf, self._seen = True, rest[1:], ""
                return out
            try:
                value, end = _DECODER.raw_decode(rest)
            except ValueError:  # not closed yet
                return out
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return out
            args = value.get("parameters", value.get("arguments", {}))
            out += call_deltas(self._calls, value["name"], json.dumps(args, ensure_ascii=False))
            self._calls += 1
            self._buf, self._seen = rest[end:], ""
        return out

    def finish(self) -> list[StreamDelta]:
        """See :meth:`ToolCallStream.finish`."""
        left = self._seen + self._buf
        self._buf = self._seen = ""
        if self._closed or not left.strip(_BLANKS):
            return []
        return [StreamDelta(content=left)]


class RequiredToolParser(ToolParser):
    """The parser of ``tool_choice: "required"``: the text is a JSON array of calls."""

    name = "required"

    def stream(self) -> RequiredToolStream:
        """See :meth:`ToolParser.stream`."""
        return RequiredToolStream()
