"""From an Anthropic Messages body to the chat route's request, and from the engine's output back to Anthropic's.

The seam for tool calls: :func:`_blocks` is where ``tool_use``/``tool_result`` blocks will become the chat
template's ``tool_calls`` and ``tool`` turns, and :func:`content_blocks` is where a tool-call parser will split
the generated text into ``text`` and ``tool_use`` blocks (with ``stop_reason`` ``tool_use``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from paged_core.frontend.outputs import CompletionOutput
from paged_core.serve.anthropic.protocol import Blocks, CountTokensRequest, MessagesRequest, TextBlock
from paged_core.serve.body import describe_errors
from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest, ChatMessage, TextPart

# Block types of Anthropic's API this server does not take yet (refused by name, never silently dropped).
NOT_YET = frozenset(
    {
        "tool_use",
        "tool_result",
        "server_tool_use",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "container_upload",
    }
)
_MESSAGE_INDEX = re.compile(r"messages\[(\d+)\](\.content)?")


def check_supported(req: CountTokensRequest) -> None:
    """Refuse (400, naming the field) what a later version will take: tools and tool choice."""
    if req.tools:
        raise APIError(400, "tools are not supported yet on this server", param="tools")
    if req.tool_choice is not None:
        raise APIError(400, "tool_choice is not supported yet on this server", param="tool_choice")


def _blocks(content: Blocks, where: str, system: bool = False) -> list[TextPart]:
    """The text blocks of ``content`` as chat text parts; any other block is a 400 naming it."""
    parts = []
    for i, block in enumerate(content):
        path = f"{where}.{i}"
        kind = block.get("type")
        if kind == "text":
            try:
                text = TextBlock.model_validate(block).text
            except ValidationError as exc:
                message, param = describe_errors(TextBlock, exc)
                field = f"{path}.{param}" if param else path
                raise APIError(400, f"{field}: {message}", param=field) from None
            parts.append(TextPart(type="text", text=text))
        elif kind in NOT_YET and not system:
            field = f"{path}.type"
            raise APIError(400, f"{field}: {kind} content blocks are not supported yet on this server", param=field)
        else:
            expected = "'text'" if system else "'text' (tool_use, tool_result and images are not supported yet)"
            field = f"{path}.type"
            raise APIError(400, f"{field}: block type {kind!r} is not accepted here; expected {expected}", param=field)
    return parts


def chat_messages(req: CountTokensRequest) -> list[ChatMessage]:
    """The conversation as chat turns: ``system`` (a string or text blocks) first, then every message."""
    check_supported(req)
    turns = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _blocks(req.system, "system", system=True)
        turns.append(ChatMessage(role="system", content=system))
    for i, m in enumerate(req.messages):
        content = m.content if isinstance(m.content, str) else _blocks(m.content, f"messages.{i}.content")
        turns.append(ChatMessage(role=m.role, content=content))
    return turns


def continues(req: CountTokensRequest) -> bool:
    """True when the last turn is the assistant's: Anthropic's prefill, which the model continues."""
    return req.messages[-1].role == "assistant"


def chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat completion request with the same conversation and sampling fields."""
    return ChatCompletionRequest(
        model=req.model,
        messages=chat_messages(req),
        max_tokens=req.max_tokens,
        stop=req.stop_sequences,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stream=req.stream,
    )


def renamed(error: APIError, has_system: bool) -> APIError:
    """``error`` (raised by the chat checks) naming the Anthropic body's fields: ``stop_sequences`` for ``stop``,
    and the message index the client sent (the system prompt is the chat's first turn)."""

    def index(match: re.Match[str]) -> str:
        i = int(match.group(1)) - has_system
        return "system" if i < 0 else f"messages.{i}{match.group(2) or ''}"

    error.message = _MESSAGE_INDEX.sub(index, error.message)
    if error.param == "stop":
        error.param = "stop_sequences"
        error.message = re.sub(r"^stop\b", "stop_sequences", error.message)
    elif error.param == "max_completion_tokens":
        error.param = "max_tokens"
    return error


def stop_reason(c: CompletionOutput) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a finished sequence."""
    if c.finish_reason == "length":
        return "max_tokens", None
    if isinstance(c.stop_reason, str):  # a stop string; a stop token id (the end of turn) is no sequence of text
        return "stop_sequence", c.stop_reason
    return "end_turn", None


def content_blocks(text: str) -> list[dict[str, Any]]:
    """The response's content blocks: one text block, none for empty text (a tool-call parser plugs in here)."""
    return [{"type": "text", "text": text}] if text else []


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic's usage object."""
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message_body(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    input_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """A ``message`` object: the whole response, or (no content, no stop reason) the one ``message_start`` carries."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage(input_tokens, output_tokens),
    }
