"""An Anthropic conversation as chat turns, each named by the field of the body it came from.

``system`` and text blocks become turns of text; an assistant's ``tool_use`` blocks become its turn's
``tool_calls`` (the input written as the JSON arguments OpenAI clients send), and each ``tool_result`` block of a
user message becomes a ``tool`` turn answering its ``tool_use_id``, between the user's text turns in the order
the blocks came. The chat template then reads them exactly as it reads an OpenAI conversation.
"""

from __future__ import annotations

import json

from paged_core.serve.anthropic.protocol import (
    Blocks,
    CountTokensRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    validated,
)
from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatMessage, TextPart
from paged_core.serve.tools.request import FunctionCall, MessageToolCall

# Block types of Anthropic's API this server does not take (refused by name, never silently dropped).
NOT_TAKEN = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "container_upload",
    }
)
# What each place takes besides text.
_TOOL_BLOCK = {"assistant": "tool_use", "user": "tool_result"}

Turn = tuple[str, ChatMessage]
"""A chat turn and the body field it came from (``system``, ``messages.3``, ``messages.3.content.1``)."""


def _refuse(kind: object, path: str, role: str) -> APIError:
    field = f"{path}.type"
    if kind in NOT_TAKEN:
        return APIError(400, f"{field}: {kind} content blocks are not supported yet on this server", param=field)
    if kind in _TOOL_BLOCK.values():
        place = {"system": "the system prompt", "tool_result": "a tool_result's content"}.get(role, f"{role} messages")
        owner = next(r for r, k in _TOOL_BLOCK.items() if k == kind)
        return APIError(400, f"{field}: {kind} blocks go in {owner} messages, not in {place}", param=field)
    expected = " or ".join(repr(k) for k in ("text", _TOOL_BLOCK.get(role)) if k)
    return APIError(400, f"{field}: block type {kind!r} is not accepted here; expected {expected}", param=field)


def text_parts(content: Blocks, where: str, role: str = "system") -> list[TextPart]:
    """Text blocks as chat text parts; any other block is a 400 naming it."""
    parts = []
    for i, block in enumerate(content):
        if block.get("type") != "text":
            raise _refuse(block.get("type"), f"{where}.{i}", role)
        parts.append(TextPart(type="text", text=validated(TextBlock, block, f"{where}.{i}").text))
    return parts


def _assistant(content: Blocks, where: str) -> ChatMessage:
    parts, calls = [], []
    for i, block in enumerate(content):
        path = f"{where}.content.{i}"
        kind = block.get("type")
        if kind == "text":
            parts.append(TextPart(type="text", text=validated(TextBlock, block, path).text))
        elif kind == "tool_use":
            use = validated(ToolUseBlock, block, path)
            arguments = json.dumps(use.input, ensure_ascii=False)
            calls.append(MessageToolCall(id=use.id, function=FunctionCall(name=use.name, arguments=arguments)))
        else:
            raise _refuse(kind, path, "assistant")
    return ChatMessage(role="assistant", content=parts, tool_calls=calls or None)


def _user(content: Blocks, where: str) -> list[Turn]:
    turns: list[Turn] = []
    parts: list[TextPart] = []
    for i, block in enumerate(content):
        path = f"{where}.content.{i}"
        kind = block.get("type")
        if kind == "text":
            parts.append(TextPart(type="text", text=validated(TextBlock, block, path).text))
        elif kind == "tool_result":
            if parts:
                turns.append((where, ChatMessage(role="user", content=parts)))
                parts = []
            result = validated(ToolResultBlock, block, path)
            body = result.content
            text = text_parts(body, f"{path}.content", "tool_result") if isinstance(body, list) else body or ""
            turns.append((path, ChatMessage(role="tool", content=text, tool_call_id=result.tool_use_id)))
        else:
            raise _refuse(kind, path, "user")
    if parts or not turns:
        turns.append((where, ChatMessage(role="user", content=parts)))
    return turns


def conversation(req: CountTokensRequest) -> list[Turn]:
    """The conversation as chat turns: ``system`` (a string or text blocks) first, then every message."""
    turns: list[Turn] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else text_parts(req.system, "system")
        turns.append(("system", ChatMessage(role="system", content=system)))
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if isinstance(m.content, str):
            turns.append((where, ChatMessage(role=m.role, content=m.content)))
        elif m.role == "assistant":
            turns.append((where, _assistant(m.content, where)))
        else:
            turns += _user(m.content, where)
    return turns
