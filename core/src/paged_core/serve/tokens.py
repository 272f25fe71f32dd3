"""Tokenizer use on the server: prompts, chat templates, and token strings/bytes for logprobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatMessage


def _byte_decoder() -> dict[str, int]:
    """Inverse of byte-level BPE's byte-to-printable-character table (bytes of each token string)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


_BYTES = _byte_decoder()


class Tokens:
    """Wraps the engine's tokenizer (read-only use, safe next to the engine thread's decoding)."""

    def __init__(self, tokenizer: Any | None, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._text: dict[int, tuple[str, list[int]]] = {}
        self._byte_level = _is_byte_level(tokenizer)

    def require(self, what: str) -> Any:
        """The tokenizer, or a 400 saying that ``what`` needs one."""
        if self.tokenizer is None:
            raise APIError(400, f"{what} needs a tokenizer, and this model has none; send token ids instead")
        return self.tokenizer

    def encode(self, text: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; an empty result is a 400."""
        if not text:
            raise APIError(400, f"{param} is empty", param=param)
        ids = [int(t) for t in self.require("a text prompt").encode(text, add_special_tokens=add_special_tokens)]
        if not ids:
            raise APIError(400, f"{param} encodes to no tokens", param=param)
        return ids

    def check_ids(self, ids: Sequence[int], param: str) -> list[int]:
        """``ids`` if every one is a valid token id; else a 400 naming the bad ones."""
        if not ids:
            raise APIError(400, f"{param} is empty", param=param)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(400, f"{param}: token ids must be in [0, {self.vocab_size}); got {bad[:5]}", param=param)
        return list(ids)

    def render_chat(
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> list[int]:  # fmt: skip
        """Token ids of a conversation through the model's chat template."""
        tok = self.require("chat")
        if not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions with a plain prompt")
        # Templates predating the 'developer' role know it as 'system'.
        conv = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
        try:
            ids = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt, tokenize=True,
                                          **dict(extra or {}))  # fmt: skip
        except Exception as exc:  # jinja raises its own errors for conversations a template refuses
            raise APIError(400, f"chat template failed on these messages: {exc}", param="messages") from None
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return self.check_ids([int(t) for t in ids], "messages")

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens kept, as /detokenize should show them)."""
        return str(self.require("detokenize").decode(list(ids), skip_special_tokens=False))

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        """One token's text and raw bytes (cached), as logprobs report them."""
        hit = self._text.get(token_id)
        if hit is not None:
            return hit
        if self.tokenizer is None:
            result = (f"token_id:{token_id}", list(str(token_id).encode()))
        else:
            text = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if self._byte_level and isinstance(raw, str) and raw and all(c in _BYTES for c in raw):
                result = (text, [_BYTES[c] for c in raw])
            else:
                result = (text, list(text.encode("utf-8")))
        self._text[token_id] = result
        return result


def _is_byte_level(tokenizer: Any | None) -> bool:
    """True for byte-level BPE vocabularies, whose token strings map back to bytes through :data:`_BYTES`."""
    if tokenizer is None:
        return False
    try:
        pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(" a", add_special_tokens=False))
    except Exception:
        return False
    return any(isinstance(p, str) and p.startswith("\u0120") for p in pieces)
