"""Conversation messages as chat templates read them, tool calls and tool results included."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatMessage


def template_message(i: int, m: ChatMessage) -> dict[str, Any]:
    """Message ``i`` as a template dict: ``role``, ``content`` (text), and when present ``name``, ``tool_calls``
    (arguments decoded to a dict, as HF templates expect) and ``tool_call_id``.

    Templates predating the 'developer' role know it as 'system'.
    """
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        if m.role != "assistant":
            raise APIError(400, f"messages[{i}] has tool_calls, which only assistant messages carry", param="messages")
        out["tool_calls"] = [
            _call(i, j, c.id, c.function.name, c.function.arguments) for j, c in enumerate(m.tool_calls)
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _call(i: int, j: int, call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise APIError(400, f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object", param="messages")
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id is not None:
        call["id"] = call_id
    return call


def message_texts(conv: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    """Every client text of ``conv`` the template may print, named by where it came from (for the control-token
    check: a tool call's arguments could forge a turn as well as content could)."""
    for i, m in enumerate(conv):
        yield f"messages[{i}].content", m["content"]
        for key in ("name", "tool_call_id"):
            if key in m:
                yield f"messages[{i}].{key}", m[key]
        for j, call in enumerate(m.get("tool_calls", ())):
            function = call["function"]
            yield f"messages[{i}].tool_calls[{j}]", json.dumps(function, ensure_ascii=False) + call.get("id", "")


def tool_texts(tools: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    """Each tool definition as the text a template may print from it (names, descriptions, schemas)."""
    for k, tool in enumerate(tools):
        yield f"tools[{k}]", json.dumps(tool, ensure_ascii=False)
