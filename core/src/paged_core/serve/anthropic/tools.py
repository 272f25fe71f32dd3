"""Anthropic's tool fields as the chat request's, and parsed calls as Anthropic's ``tool_use`` blocks.

``tools`` become chat ``function`` tools (``input_schema`` is the ``parameters``); ``tool_choice`` ``auto`` stays
``auto`` (the server's ``--tool-call-parser`` reads the model's calls), ``any`` is chat's ``required`` and
``tool`` a named function (both enforced by a grammar, see :mod:`paged_core.serve.tools.forced`), ``none`` shows
the tools to the template and parses nothing; ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from paged_core.serve.anthropic.protocol import CountTokensRequest, ToolChoice, ToolDefinition, validated
from paged_core.serve.errors import APIError
from paged_core.serve.tools.base import StreamDelta
from paged_core.serve.tools.request import FunctionDefinition, NamedFunction, NamedToolChoice, Tool
from paged_core.serve.tools.request import ToolChoice as ChatToolChoice

_CHOICES: dict[str, ChatToolChoice] = {"auto": "auto", "any": "required", "none": "none"}


def tool_definitions(req: CountTokensRequest) -> list[ToolDefinition] | None:
    """The body's ``tools``, each validated (a 400 names the element's field)."""
    if req.tools is None:
        return None
    return [validated(ToolDefinition, t, f"tools.{k}") for k, t in enumerate(req.tools)]


def tool_choice(req: CountTokensRequest) -> ToolChoice | None:
    """The body's ``tool_choice``, validated."""
    return None if req.tool_choice is None else validated(ToolChoice, req.tool_choice, "tool_choice")


def chat_tools(req: CountTokensRequest) -> list[Tool] | None:
    """The tools as chat function tools; an ``input_schema`` that does not describe an object is a 400 naming it."""
    definitions = tool_definitions(req)
    if definitions is None:
        return None
    tools = []
    for k, t in enumerate(definitions):
        if t.input_schema.get("type") != "object":
            field = f"tools.{k}.input_schema"
            raise APIError(
                400,
                f'{field} must be the JSON schema of an object ("type": "object"): a tool\'s input is one',
                param=field,
            )
        function = FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema)
        tools.append(Tool(type="function", function=function))
    return tools


def chat_tool_choice(req: CountTokensRequest) -> ChatToolChoice | None:
    """``tool_choice`` as chat's; a ``name`` missing from a ``tool`` choice, or naming no tool, is a 400."""
    choice = tool_choice(req)
    if choice is None:
        return None
    if choice.type != "tool":
        if choice.name is not None:
            raise APIError(
                400,
                f"tool_choice.name is only for tool_choice of type 'tool', not {choice.type!r}",
                param="tool_choice.name",
            )
        return _CHOICES[choice.type]
    names = [t.name for t in tool_definitions(req) or []]
    if choice.name is None:
        raise APIError(400, "tool_choice.name is required with tool_choice of type 'tool'", param="tool_choice.name")
    if choice.name not in names:
        raise APIError(
            400,
            f"tool_choice.name names the tool {choice.name!r}, which is not in tools ({', '.join(names) or 'none'})",
            param="tool_choice.name",
        )
    return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))


def parallel(req: CountTokensRequest) -> bool:
    """Whether the model may make several calls in one turn (unless ``disable_parallel_tool_use``)."""
    choice = tool_choice(req)
    return not (choice is not None and choice.disable_parallel_tool_use)


def tool_use_id(call_id: str) -> str:
    """Anthropic's id (``toolu_...``) of a parsed call's id (``call_...``)."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the ``input`` object; arguments cut short (by ``max_tokens``) give what they
    hold so far, read as Anthropic's clients read a streamed input (partial JSON, unfinished strings left out)."""
    try:
        value = from_json(arguments, allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_blocks(pieces: Sequence[StreamDelta]) -> list[dict[str, Any]]:
    """The content blocks a tool-call parser's pieces spell out, in order: text runs as ``text`` blocks, each call
    a ``tool_use`` block; the same blocks a client builds from the streamed events of those pieces."""
    blocks: list[dict[str, Any]] = []
    arguments: dict[int, list[Any]] = {}  # call index: [its block, its arguments so far]
    for p in pieces:
        if p.call is None:
            if not p.content:
                continue
            if blocks and blocks[-1]["type"] == "text":
                blocks[-1]["text"] += p.content
            else:
                blocks.append({"type": "text", "text": p.content})
        elif p.call.id is not None:
            block = {"type": "tool_use", "id": tool_use_id(p.call.id), "name": p.call.name or "", "input": {}}
            blocks.append(block)
            arguments[p.call.index] = [block, p.call.arguments]
        else:
            arguments[p.call.index][1] += p.call.arguments
    for block, text in arguments.values():
        block["input"] = tool_input(text)
    return blocks
