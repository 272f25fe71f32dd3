"""Engine logprobs (one ``{token_id: logprob}`` per generated token) in the two OpenAI layouts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paged_core.serve.tokens import Tokens

# The engine's dicts hold the sampled token first, then the top alternatives.


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:k]


def completion_logprobs(
    tokens: Tokens, token_ids: Sequence[int], entries: Sequence[dict[int, float]], k: int, offset: int
) -> dict[str, Any]:
    """The completions layout: parallel lists of tokens, their logprobs, top alternatives and text offsets.

    ``offset`` is where the first token's text starts in the completion (for streamed chunks).
    """
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, entry in zip(token_ids, entries, strict=False):
        text = tokens.piece(tid)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(entry.get(tid, next(iter(entry.values()))))
        out["top_logprobs"].append({tokens.piece(t)[0]: lp for t, lp in _top(entry, k)})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(
    tokens: Tokens, token_ids: Sequence[int], entries: Sequence[dict[int, float]], k: int
) -> dict[str, Any]:
    """The chat layout: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``."""
    content = []
    for tid, entry in zip(token_ids, entries, strict=False):
        text, raw = tokens.piece(tid)
        top = []
        for t, lp in _top(entry, k):
            t_text, t_raw = tokens.piece(t)
            top.append({"token": t_text, "logprob": lp, "bytes": t_raw})
        content.append(
            {"token": text, "logprob": entry.get(tid, next(iter(entry.values()))), "bytes": raw, "top_logprobs": top}
        )
    return {"content": content, "refusal": None}
