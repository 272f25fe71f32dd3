"""Stop strings over streamed text: detect, truncate, and hold back what may still become one."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence


class _Automaton:
    """An Aho-Corasick automaton over a request's stop strings (immutable once built, shared by checkers).

    Node 0 is the root; node ``v`` stands for the text that leads to it, of
    ``depth[v]`` characters. ``fail[v]`` is the node of the longest proper
    suffix of that text that is also a node, and ``out[v]`` the longest stop
    string that ends the text (None: none does).
    """

    __slots__ = ("depth", "fail", "goto", "out")

    def __init__(self, stops: tuple[str, ...]) -> None:
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        out: list[str | None] = [None]
        for s in stops:
            node = 0
            for ch in s:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    out.append(None)
                node = nxt
            out[node] = s
        fail = [0] * len(goto)
        # Breadth first, so a node's failure target (always shallower) is complete before the node.
        pending = deque(goto[0].values())
        while pending:
            node = pending.popleft()
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)
                if out[child] is None:
                    out[child] = out[fail[child]]
                pending.append(child)
        self.goto, self.fail, self.depth, self.out = goto, fail, depth, out


@functools.lru_cache(maxsize=64)
def _automaton(stops: tuple[str, ...]) -> _Automaton:
    # The n sequences of a request, and repeated requests, share one build.
    return _Automaton(stops)


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

    Matching runs an Aho-Corasick automaton over all the stop strings at once,
    carried across feeds, so a feed costs time in proportion to the new text
    (amortised: :attr:`steps` never exceeds twice the characters fed) however
    many stop strings there are.
    """

    __slots__ = ("_auto", "_held", "_state", "include_stop_str_in_output", "matched", "steps", "stop")

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        items = (stop,) if isinstance(stop, str) else tuple(stop)
        for s in items:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strs; got {s!r} in {items!r}")
        self.stop: tuple[str, ...] = items
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None
        self.steps = 0  # automaton transitions taken so far (one dict look-up each): the matching cost
        self._auto = _automaton(items) if items else None
        self._state = 0
        self._held = ""

    @property
    def held(self) -> str:
        """Text received but not emitted yet (a possible stop-string start)."""
        return self._held

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Add ``delta``; return the text to emit now and the stop string matched, if any."""
        if self.matched is not None:
            return "", None
        auto = self._auto
        if auto is None:
            return delta, None
        goto, fail, out = auto.goto, auto.fail, auto.out
        state, steps = self._state, 0
        for j, ch in enumerate(delta):
            while True:
                steps += 1
                nxt = goto[state].get(ch)
                if nxt is not None:
                    state = nxt
                    break
                if state == 0:
                    break
                state = fail[state]
            hit = out[state]
            if hit is not None:
                # The first position where any stop string ends; the longest one ending there started first.
                self.steps += steps
                text = self._held + delta
                end = len(self._held) + j + 1
                self.matched, self._held, self._state = hit, "", 0
                return text[: end if self.include_stop_str_in_output else end - len(hit)], hit
        self.steps += steps
        self._state = state
        text = self._held + delta
        # The state's depth is the longest suffix of the stream that is a proper prefix of a stop string.
        keep = auto.depth[state]
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """Release the held-back text (the request ended without a stop string)."""
        held, self._held, self._state = self._held, "", 0
        return held
