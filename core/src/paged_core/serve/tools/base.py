"""The tool-call parser interface: what a parser returns, whole (:meth:`ToolParser.extract`) and streamed.

A parser reads the model's raw text and splits it into assistant ``content`` and :class:`ToolCall`\\ s. Streaming
goes through a :class:`ToolCallStream` per choice: :meth:`~ToolCallStream.feed` takes each new piece of text and
returns :class:`StreamDelta`\\ s (content until a call starts, then for each call a header delta with its index,
id and name, then its arguments), and :meth:`~ToolCallStream.finish` releases what was held back. The contract
every parser keeps (its tests check it with the text cut at every position): the joined deltas equal
:meth:`ToolParser.extract` of the whole text, whatever the cuts.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: a function name and its arguments as JSON text (an object)."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        """The call as an element of OpenAI's ``message.tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ExtractedToolCalls:
    """What a whole text holds: ``content`` (None when calls were found and no other text was) and the calls."""

    content: str | None
    calls: list[ToolCall]


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call ``index``: the header (``id`` and ``name`` set, no arguments) or an arguments fragment."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The piece as an element of a streamed ``delta.tool_calls``."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class StreamDelta:
    """One streamed piece: text for ``content``, or a piece of a tool call."""

    content: str | None = None
    call: ToolCallDelta | None = None


class ToolCallStream(ABC):
    """Incremental parsing of one choice's text; feed it every new piece, then call :meth:`finish` once."""

    @abstractmethod
    def feed(self, text: str) -> list[StreamDelta]:
        """The deltas ``text`` releases (text that may still start a call is held back)."""

    @abstractmethod
    def finish(self) -> list[StreamDelta]:
        """The deltas left once the text is complete (held-back text, an unterminated last call)."""


class ToolParser(ABC):
    """A model family's tool-call format. Subclasses set :attr:`name` and implement :meth:`stream`.

    ``tools`` are the request's tool definitions (OpenAI's ``{"type": "function", "function": {...}}`` dicts),
    for formats that need them; the built-in parsers do not. :meth:`extract` runs the stream over the whole
    text, so the two agree by construction; a parser may override it.
    """

    name: ClassVar[str]

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self.tools = list(tools)

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh incremental parser for one choice."""

    def extract(self, text: str) -> ExtractedToolCalls:
        """The content and calls of a complete text."""
        stream = self.stream()
        return assemble([*stream.feed(text), *stream.finish()])


def assemble(deltas: Sequence[StreamDelta]) -> ExtractedToolCalls:
    """The content and calls that ``deltas`` spell out (what a client joining the stream sees)."""
    content = "".join(d.content for d in deltas if d.content is not None)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.call is None:
            continue
        if d.call.id is not None:
            calls[d.call.index] = [d.call.id, d.call.name or "", d.call.arguments]
        else:
            calls[d.call.index][2] += d.call.arguments
    found = [ToolCall(name, args, cid) for cid, name, args in (calls[i] for i in sorted(calls))]
    return ExtractedToolCalls(None if found and not content else content, found)


def call_from_json(value: Any) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of a decoded ``{"name": ..., "arguments"|"parameters": {...}}``; None if not one.

    Arguments must be a JSON object (absent means ``{}``); they are written back compactly by the json module,
    so the streamed and whole results carry the same text.
    """
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return value["name"], json.dumps(args, ensure_ascii=False)


def call_deltas(index: int, name: str, arguments: str) -> list[StreamDelta]:
    """A complete call as OpenAI streams one: the header (index, id, name), then the arguments."""
    header = ToolCallDelta(index, id=new_call_id(), name=name)
    return [StreamDelta(call=header), StreamDelta(call=ToolCallDelta(index, arguments=arguments))]


def held_prefix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that could be the start of ``marker`` (so must wait)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
