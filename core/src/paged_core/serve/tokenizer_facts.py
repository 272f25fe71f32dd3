"""What the server learns once from its tokenizer: a characters-per-token bound and the control-token strings."""

from __future__ import annotations

from typing import Any

# Normalisers can shrink text before it is split (NFC/NFKC compose a letter and its combining marks into one
# character, some strip accents or control characters), so one token may stand for more characters than its
# vocabulary string has. 4x covers any composition a real normaliser does; refusing needs only a bound, not a
# tight one.
NORMALISER_SAFETY = 4


def max_chars_per_token(tokenizer: Any | None, byte_level: bool) -> int | None:
    """An upper bound on the characters of input text one token can stand for; None when there is none.

    A bound exists only when the vocabulary covers every input byte: byte-level BPE (``byte_level``) or byte
    fallback pieces ``<0x00>``..``<0xFF>``. Then no run of unknown text collapses into one ``<unk>`` token, and
    a token covers at most as many characters as its vocabulary string has: a byte-level string holds one
    character per byte (and a character is at least one byte), a SentencePiece ``▁`` stands for one space,
    added tokens are their own text. So ``text`` needs at least ``len(text) / bound`` tokens, whatever it is.
    WordPiece-style vocabularies turn a whole unknown word into one ``[UNK]``: no bound.
    """
    if tokenizer is None or not callable(getattr(tokenizer, "get_vocab", None)):
        return None
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a readable vocabulary simply gets no pre-check
        return None
    if not vocab:
        return None
    if not (byte_level or ("<0x00>" in vocab and "<0xFF>" in vocab)):
        return None
    longest = max(len(piece) for piece in vocab if isinstance(piece, str))
    return NORMALISER_SAFETY * max(1, longest)


def control_tokens(tokenizer: Any | None, chat_template: str | None = None) -> tuple[str, ...]:
    """The strings that encode as control tokens: the special tokens, and added tokens the chat template writes.

    Text containing one of them in a user's message would be encoded as that token, letting the user end their
    turn and open another (a forged system message), so chat content is checked against these.
    """
    if tokenizer is None:
        return ()
    found = {t for t in getattr(tokenizer, "all_special_tokens", None) or () if isinstance(t, str)}
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    template_text = template if isinstance(template, str) else str(template)  # a dict of named templates
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for token in added.values():
        content = getattr(token, "content", None)
        if isinstance(content, str) and (getattr(token, "special", False) or content in template_text):
            found.add(content)
    # Whitespace added tokens (Gemma's "\n") appear in templates as ordinary text, not as control tokens.
    return tuple(sorted(t for t in found if t and not t.isspace()))
