"""Checks every tool-call parser must pass: streaming with any cuts spells out what extract() finds whole."""

from __future__ import annotations

from paged_core.serve.tools.base import ExtractedToolCalls, StreamDelta, ToolParser, assemble


def shape(found: ExtractedToolCalls) -> tuple[str | None, list[tuple[str, str]]]:
    """Content and (name, arguments) of each call: ids are fresh on every parse."""
    return found.content, [(c.name, c.arguments) for c in found.calls]


def streamed(parser: ToolParser, pieces: list[str]) -> list[StreamDelta]:
    stream = parser.stream()
    deltas = [d for piece in pieces for d in stream.feed(piece)]
    return deltas + stream.finish()


def check_every_cut(parser: ToolParser, text: str) -> ExtractedToolCalls:
    """extract(text), after checking that the text cut at every position (and fed a character at a time) streams
    to the same content and calls, with each call's header (index, id, name) before its arguments."""
    whole = parser.extract(text)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in cuts:
        deltas = streamed(parser, pieces)
        assert shape(assemble(deltas)) == shape(whole), pieces
        headers = [d.call.index for d in deltas if d.call is not None and d.call.id is not None]
        assert headers == list(range(len(whole.calls))), pieces
        for d in deltas:
            if d.call is not None and d.call.id is not None:
                assert d.call.id.startswith("call_") and d.call.name and d.call.arguments == ""
    return whole
