"""The tool fields of a chat request: ``tools``, ``tool_choice``, and the tool parts of conversation messages."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDefinition(_Strict):
    """A function the model may call: its name (OpenAI's rule: 1-64 of ``a-zA-Z0-9_-``), description, schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """One element of ``tools``: only ``function`` tools exist in chat completions."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(_Strict):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    """The function part of an assistant message's tool call: arguments are JSON text, as OpenAI sends them."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: str
    arguments: str


class MessageToolCall(BaseModel):
    """An element of an assistant message's ``tool_calls`` (a call the model made earlier in the conversation)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
