"""Checking a chat request's ``tools`` and ``tool_choice`` against the server: each refusal a 400 naming the field."""

from __future__ import annotations

from typing import Any

from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest
from paged_core.serve.settings import ServeConfig
from paged_core.serve.tools.base import ToolParser
from paged_core.serve.tools.forced import NamedToolParser, RequiredToolParser, parameters_schema, required_schema
from paged_core.serve.tools.registry import create_tool_parser


def effective_choice(req: ChatCompletionRequest) -> Any:
    """``tool_choice`` as sent, else OpenAI's default: ``"auto"`` with tools, ``"none"`` without."""
    if req.tool_choice is not None:
        return req.tool_choice
    return "auto" if req.tools else "none"


def tool_parser_for(req: ChatCompletionRequest, config: ServeConfig) -> ToolParser | None:
    """The parser for this request's output (None: its text is plain content); refuses what cannot be honoured.

    ``required`` and a named function get a parser of the output that :func:`tool_schema` constrains (see
    :mod:`.forced`): they need no server flags, since the grammar, not the model's format, makes the calls.
    """
    tools = req.tools or []
    choice = effective_choice(req)
    if choice != "none" and not tools:
        raise APIError(400, "tool_choice other than 'none' needs tools; none were sent", param="tool_choice")
    names = [t.function.name for t in tools]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise APIError(400, f"tools define the function(s) {', '.join(repeated)} more than once", param="tools")
    if choice == "none":
        return None
    if choice == "required":
        return RequiredToolParser(template_tools(req) or ())
    if choice != "auto":
        name = choice.function.name
        if name not in names:
            raise APIError(
                400,
                f"tool_choice names the function {name!r}, which is not in tools ({', '.join(names)})",
                param="tool_choice",
            )
        return NamedToolParser(name, template_tools(req) or ())
    if not config.enable_auto_tool_choice or config.tool_call_parser is None:
        raise APIError(
            400,
            '"auto" tool choice (the default when tools are sent) requires the server to run with '
            "--enable-auto-tool-choice and --tool-call-parser; send tool_choice 'none' to show the tools only",
            param="tool_choice",
        )
    return create_tool_parser(config.tool_call_parser, template_tools(req) or ())


def tool_schema(req: ChatCompletionRequest) -> tuple[dict[str, Any], str] | None:
    """The JSON schema a ``required`` or named ``tool_choice`` constrains the output to, and the request field
    that schema comes from (named in errors); None for ``none`` and ``auto``. Call after :func:`tool_parser_for`.
    """
    choice = effective_choice(req)
    tools = req.tools or []
    if choice == "required":
        return required_schema(tools, req.parallel_tool_calls), "tools"
    if choice in ("none", "auto"):
        return None
    (k, tool) = next((k, t) for k, t in enumerate(tools) if t.function.name == choice.function.name)
    return parameters_schema(tool), f"tools.{k}.function.parameters"


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as the chat template reads them (OpenAI's dicts), or None when there are none."""
    if not req.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
