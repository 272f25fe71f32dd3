"""Checking a chat request's ``tools`` and ``tool_choice`` against the server: each refusal a 400 naming the field."""

from __future__ import annotations

from typing import Any

from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatCompletionRequest
from paged_core.serve.settings import ServeConfig
from paged_core.serve.tools.base import ToolParser
from paged_core.serve.tools.registry import create_tool_parser

NOT_YET = "needs structured outputs (not yet): this server cannot constrain the output to a call"


def effective_choice(req: ChatCompletionRequest) -> Any:
    """``tool_choice`` as sent, else OpenAI's default: ``"auto"`` with tools, ``"none"`` without."""
    if req.tool_choice is not None:
        return req.tool_choice
    return "auto" if req.tools else "none"


def tool_parser_for(req: ChatCompletionRequest, config: ServeConfig) -> ToolParser | None:
    """The parser for this request's output (None: its text is plain content); refuses what cannot be honoured.

    ``required`` and a named function are where a grammar over the tools' schemas plugs in (structured outputs).
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
        raise APIError(400, f"tool_choice 'required' {NOT_YET}", param="tool_choice")
    if choice != "auto":
        name = choice.function.name
        if name not in names:
            raise APIError(
                400,
                f"tool_choice names the function {name!r}, which is not in tools ({', '.join(names)})",
                param="tool_choice",
            )
        raise APIError(400, f"a named tool_choice {NOT_YET}", param="tool_choice")
    if not config.enable_auto_tool_choice or config.tool_call_parser is None:
        raise APIError(
            400,
            '"auto" tool choice (the default when tools are sent) requires the server to run with '
            "--enable-auto-tool-choice and --tool-call-parser; send tool_choice 'none' to show the tools only",
            param="tool_choice",
        )
    return create_tool_parser(config.tool_call_parser, template_tools(req) or ())


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as the chat template reads them (OpenAI's dicts), or None when there are none."""
    if not req.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
