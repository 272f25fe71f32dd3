"""The content rule shared by parsers that allow text around calls: whitespace between calls is not content."""

from __future__ import annotations

from paged_core.serve.tools.base import StreamDelta


class ContentSegments:
    """Streams the text between calls, dropping a segment that is only whitespace once a call bounds it.

    Models put newlines around their call blocks; a client would otherwise get ``content: "\\n\\n"`` beside
    its tool calls. Text with no call at all is returned whole, whitespace included. Whitespace is held back
    until the segment shows text (then it goes out) or a call closes the segment (then it is dropped).
    """

    def __init__(self) -> None:
        self.calls = 0
        self._held = ""
        self._shown = False

    def text(self, text: str) -> list[StreamDelta]:
        """Content of the current segment."""
        if not text:
            return []
        if self._shown:
            return [StreamDelta(content=text)]
        self._held += text
        if self._held.isspace():
            return []
        self._shown, out, self._held = True, self._held, ""
        return [StreamDelta(content=out)]

    def call(self) -> None:
        """A call ended the current segment."""
        self.calls += 1
        self._held, self._shown = "", False

    def finish(self) -> list[StreamDelta]:
        """The held whitespace when no call was found (the text is then all content), else nothing."""
        out, self._held = self._held, ""
        return [StreamDelta(content=out)] if out and self.calls == 0 else []
