"""Tool calls on chat completions: the request fields, their validation, and tool-call parsers by name.

``tool_choice: "auto"`` (the default when ``tools`` are sent) needs ``--enable-auto-tool-choice`` and a
``--tool-call-parser``: the model writes calls in its own format and a parser (:mod:`.hermes`,
:mod:`.llama3_json`, or one registered by a third party, see :mod:`.registry`) turns them into OpenAI's
``tool_calls``, whole or as streamed deltas. ``"none"`` shows the tools to the template and parses nothing.
``"required"`` and a named function are enforced by a grammar over the tools' schemas (:mod:`.forced`):
:func:`~paged_core.serve.tools.validate.tool_parser_for` picks their parser and
:func:`~paged_core.serve.tools.validate.tool_schema` their constraint.
"""

from paged_core.serve.tools.base import (
    ExtractedToolCalls,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
)
from paged_core.serve.tools.registry import (
    create_tool_parser,
    register_tool_parser,
    tool_parser_class,
    tool_parser_names,
)

__all__ = [
    "ExtractedToolCalls",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "create_tool_parser",
    "register_tool_parser",
    "tool_parser_class",
    "tool_parser_names",
]
