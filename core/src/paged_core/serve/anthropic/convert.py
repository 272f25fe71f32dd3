"""From an Anthropic Messages body to the chat route's request, and from the engine's output back to Anthropic's.

The conversation goes through :mod:`.blocks` and the tool fields through :mod:`.tools`; the chat request then
takes the chat route's own checks, template and tool-call parsing, and :func:`content_blocks` turns what the
parser found into ``text`` and ``tool_use`` blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from paged_core.frontend.outputs import CompletionOutput
from paged_core.serve.anthropic.blocks import conversation
from paged_core.serve.anthropic.protocol import CountTokensRequest, MessagesRequest
from paged_core.serve.anthropic.tools import chat_tool_choice, chat_tools, parallel, tool_blocks
from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest
from paged_core.serve.tools.base import ToolParser
from paged_core.serve.tools.choices import ChoiceStreams

_MESSAGE_INDEX = re.compile(r"messages\[(\d+)\](\.content)?")
_PARAMETERS = re.compile(r"tools\.(\d+)\.function\.parameters")
# Chat's spelling of tool choices in its error messages, and Anthropic's.
_CHOICE_WORDS = {'"auto" tool choice': 'tool_choice {"type": "auto"}', "'none'": '{"type": "none"}'}


@dataclass(frozen=True)
class Converted:
    """The chat request of an Anthropic body, and for each chat message the body field it came from."""

    chat: ChatCompletionRequest
    origins: list[str]

    def renamed(self, error: APIError) -> APIError:
        """``error`` (raised by the chat checks) naming the Anthropic body's fields: the message the client sent,
        ``stop_sequences`` for ``stop``, ``max_tokens``, a tool's ``input_schema``, Anthropic's tool choices."""

        def index(match: re.Match[str]) -> str:
            origin = self.origins[int(match.group(1))]
            return origin if origin == "system" else origin + (match.group(2) or "")

        error.message = _MESSAGE_INDEX.sub(index, error.message)
        if error.param == "stop":
            error.param = "stop_sequences"
            error.message = re.sub(r"^stop\b", "stop_sequences", error.message)
        elif error.param == "max_completion_tokens":
            error.param = "max_tokens"
        elif error.param is not None and _PARAMETERS.fullmatch(error.param):
            error.param = _PARAMETERS.sub(r"tools.\1.input_schema", error.param)
            error.message = _PARAMETERS.sub(r"tools.\1.input_schema", error.message)
        elif error.param == "tool_choice":
            for chat, anthropic in _CHOICE_WORDS.items():
                error.message = error.message.replace(chat, anthropic)
        return error


def convert(req: CountTokensRequest) -> Converted:
    """The chat completion request with the same conversation, tools and (for a message) sampling fields."""
    turns = conversation(req)
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": [m for _, m in turns],
        "tools": chat_tools(req),
        "tool_choice": chat_tool_choice(req),
        "parallel_tool_calls": parallel(req),
    }
    if isinstance(req, MessagesRequest):
        fields |= {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "stream": req.stream,
        }
    return Converted(ChatCompletionRequest(**fields), [origin for origin, _ in turns])


def continues(req: CountTokensRequest) -> bool:
    """True when the last turn is the assistant's: Anthropic's prefill, which the model continues."""
    return req.messages[-1].role == "assistant"


def stop_reason(c: CompletionOutput, called: bool = False) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a finished sequence (``tool_use`` when it made calls
    and stopped by itself)."""
    if c.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(c.stop_reason, str):  # a stop string; a stop token id (the end of turn) is no sequence of text
        return "stop_sequence", c.stop_reason
    return "end_turn", None


def content_blocks(text: str, parser: ToolParser | None = None, parallel_calls: bool = True) -> list[dict[str, Any]]:
    """The response's content blocks: the text (none when empty) or, with a tool-call ``parser``, its text and
    calls in the order the model wrote them, as the streamed events of the same text build them."""
    if parser is None:
        return [{"type": "text", "text": text}] if text else []
    return tool_blocks(ChoiceStreams(parser, parallel_calls).pieces(0, text, finished=True))


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
