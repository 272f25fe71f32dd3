"""Request bodies of Anthropic's Messages API, validated strictly (unknown fields are refused, as Anthropic does).

Content blocks, tools and tool_choice are kept raw here and validated one by one (:func:`validated`): a block
this server does not take (``image``, ``document``...) is refused by name rather than by a union's validation
errors, and every error names its element (``tools.2.input_schema``).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from paged_core.serve.body import describe_errors
from paged_core.serve.errors import APIError

Blocks = list[dict[str, Any]]
M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], value: object, path: str) -> M:
    """``value`` (the body's element at ``path``) as ``model``; a 400 naming the field inside it otherwise."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        message, param = describe_errors(model, exc)
        field = f"{path}.{param}" if param else path
        raise APIError(400, f"{field}: {message}", param=field) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextBlock(_Strict):
    """A ``text`` content block; ``cache_control`` and ``citations`` are accepted and ignored."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(_Strict):
    """An assistant's ``tool_use`` block: a call it made earlier in the conversation."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    """A user's ``tool_result`` block: what the call ``tool_use_id`` returned, as a string or text blocks.

    ``is_error`` is accepted; chat templates have no place for it, so the model sees the content alone.
    """

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | Blocks | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class ToolDefinition(_Strict):
    """A client tool: its name (1-64 of ``a-zA-Z0-9_-``, as chat functions), description and ``input_schema``.

    Anthropic's server tools (``type`` other than ``custom``: web search, bash...) do not exist here.
    """

    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    """Accepted: under ``any`` and ``tool`` the grammar enforces the schema whatever it says."""


class ToolChoice(_Strict):
    """``tool_choice``: ``auto``, ``any`` (some tool), ``tool`` (the one ``name``d) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class InputMessage(_Strict):
    """One turn: ``content`` is a string or a list of content blocks."""

    role: Literal["user", "assistant"]
    content: str | Blocks


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: the conversation and the tools it may call."""

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | Blocks | None = None
    tools: list[dict[str, Any]] | None = None
    """:class:`ToolDefinition`\\ s, validated by :func:`.tools.tool_definitions`."""
    tool_choice: dict[str, Any] | None = None
    """A :class:`ToolChoice`, validated by :func:`.tools.tool_choice`."""


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    """Accepted and ignored (Anthropic's ``user_id``)."""
