"""Tool-call parsers by name (``--tool-call-parser NAME``): the built-in ones and those of installed packages.

A third party adds a parser by subclassing :class:`~paged_core.serve.tools.base.ToolParser` and either calling
:func:`register_tool_parser` on it (in-process use of ``build_app``) or declaring an entry point in the
``paged.tool_parsers`` group (``NAME = "package.module:ParserClass"``), which ``paged serve`` loads on start.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Mapping, Sequence
from typing import Any

from paged_core.errors import ConfigError
from paged_core.serve.tools.base import ToolParser
from paged_core.serve.tools.hermes import HermesToolParser
from paged_core.serve.tools.llama3_json import Llama3JsonToolParser

ENTRY_POINT_GROUP = "paged.tool_parsers"

_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesToolParser, Llama3JsonToolParser)}
_loaded_entry_points = False


def register_tool_parser(parser: type[ToolParser]) -> type[ToolParser]:
    """Make ``parser`` selectable by its ``name`` (usable as a class decorator); a taken name is refused."""
    known = _PARSERS.get(parser.name)
    if known is not None and known is not parser:
        raise ConfigError(f"a tool-call parser named {parser.name!r} is already registered ({known.__qualname__})")
    _PARSERS[parser.name] = parser
    return parser


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _PARSERS:
            register_tool_parser(ep.load())


def tool_parser_names() -> list[str]:
    """Every selectable parser name, sorted."""
    _load_entry_points()
    return sorted(_PARSERS)


def tool_parser_class(name: str) -> type[ToolParser]:
    """The parser called ``name``; a :class:`ConfigError` listing the known names if there is none."""
    names = tool_parser_names()
    if name not in _PARSERS:
        raise ConfigError(f"unknown tool-call parser {name!r}; known: {', '.join(names)}")
    return _PARSERS[name]


def create_tool_parser(name: str, tools: Sequence[Mapping[str, Any]] = ()) -> ToolParser:
    """A parser instance for one request's ``tools``."""
    return tool_parser_class(name)(tools)
