"""Stop strings over streamed text: detect, truncate, and hold back what may still become one."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringChecker:
    """Watches a request's streamed text for its stop strings.

    :meth:`feed` takes each new text delta and returns ``(emit, matched)``:
    the text safe to show now, and the stop string that ended the request
    (or None). A stop string may span deltas. The output is cut before the
    match (or after it with ``include_stop_str_in_output``). Trailing text
    that is a proper prefix of some stop string (at most ``max(len(s)) - 1``
    characters) is held back, so a client never sees the start of a stop
    string that is later cut; :meth:`flush` releases it when the request ends
    for another reason. When two stop strings match, the one that completes
    first in the text wins (the earlier-starting one on a tie), which is what
    a token-by-token stream would have seen. Once matched, the checker is
    done: later feeds emit nothing.
    """

    __slots__ = ("_held", "include_stop_str_in_output", "matched", "stop")

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        items = (stop,) if isinstance(stop, str) else tuple(stop)
        for s in items:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strs; got {s!r} in {items!r}")
        self.stop: tuple[str, ...] = items
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None
        self._held = ""

    @property
    def held(self) -> str:
        """Text received but not emitted yet (a possible stop-string start)."""
        return self._held

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Add ``delta``; return the text to emit now and the stop string matched, if any."""
        if self.matched is not None:
            return "", None
        if not self.stop:
            return delta, None
        text = self._held + delta
        # Only the held text (no match, by construction) precedes the delta, so
        # a whole-buffer search finds each stop string's first completion.
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            start = text.find(s)
            if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        if best is not None:
            end, start, s = best
            self.matched = s
            self._held = ""
            return text[: end if self.include_stop_str_in_output else start], s
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """Release the held-back text (the request ended without a stop string)."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = min(max(len(s) for s in self.stop) - 1, len(text))
        for size in range(longest, 0, -1):
            tail = text[-size:]
            if any(len(s) > size and s.startswith(tail) for s in self.stop):
                return size
        return 0
