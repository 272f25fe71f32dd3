"""Request bodies of Anthropic's Messages API, validated strictly (unknown fields are refused, as Anthropic does).

Content is kept as raw blocks here: :mod:`.convert` reads each one by its ``type``, so that a block this server
does not take yet (``tool_use``, ``image``...) is refused by name rather than by a union's validation errors.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Blocks = list[dict[str, Any]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextBlock(_Strict):
    """A ``text`` content block; ``cache_control`` and ``citations`` are accepted and ignored."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class InputMessage(_Strict):
    """One turn: ``content`` is a string or a list of content blocks."""

    role: Literal["user", "assistant"]
    content: str | Blocks


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: the conversation alone."""

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | Blocks | None = None
    # Refused by name (not supported yet), so a client sending them learns why.
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


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
