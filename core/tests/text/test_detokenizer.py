"""IncrementalDetokenizer against real tokenizers: exact text, no U+FFFD mid-character, small windows."""

from __future__ import annotations

from typing import Any

import pytest

from paged_core.text import IncrementalDetokenizer

TEXTS = [
    "Plain ASCII text, with punctuation; and numbers 12345.",
    "Accents: café, naïve, résumé, Ångström, Dvořák, ñandú.",
    "Emoji 🎉🚀 and flags 🇫🇷 and a family 👨‍👩‍👧 and skin tone 👍🏽!",
    "CJK: 日本語のテキスト、中文字符，한국어 문장。",
    "Mixed: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝛼 + ∑ ≤ ∞, then ascii again.",
    " leading space, trailing space ",
]
PROMPT = "Translate into many scripts:"


def stream(tokenizer: Any, ids: list[int], prompt: list[int], chunk: int = 1, **kwargs: Any) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt, **kwargs)
    deltas = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    assert "".join(deltas) == detok.text
    return deltas


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("with_prompt", [False, True])
def test_token_by_token_matches_full_decode_without_replacement_chars(
    smollm_tokenizer: Any, text: str, with_prompt: bool
) -> None:
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False) if with_prompt else []
    deltas = stream(smollm_tokenizer, ids, prompt)
    assert "".join(deltas) == smollm_tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas), deltas


def test_the_text_really_has_characters_split_across_tokens(smollm_tokenizer: Any) -> None:
    # Guards the test above: some single tokens of these texts decode to U+FFFD on their own.
    ids = smollm_tokenizer.encode(TEXTS[2] + TEXTS[3], add_special_tokens=False)
    assert any("\ufffd" in smollm_tokenizer.decode([t]) for t in ids)
    deltas = stream(smollm_tokenizer, ids, [])
    assert "" in deltas  # some pushes had to wait for the rest of a character


@pytest.mark.parametrize("chunk", [2, 3, 5, 64])
def test_chunked_pushes_give_the_same_text(smollm_tokenizer: Any, chunk: int) -> None:
    text = "".join(TEXTS)
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(smollm_tokenizer, ids, [], chunk=chunk)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_special_tokens_skipped_or_kept(smollm_tokenizer: Any) -> None:
    ids = smollm_tokenizer.encode("Hi<|im_end|> there 🎉", add_special_tokens=False)
    assert smollm_tokenizer.eos_token_id is not None
    skipped = stream(smollm_tokenizer, ids, [])
    kept = stream(smollm_tokenizer, ids, [], skip_special_tokens=False)
    assert "".join(skipped) == smollm_tokenizer.decode(ids, skip_special_tokens=True) == "Hi there 🎉"
    assert "".join(kept) == smollm_tokenizer.decode(ids) == "Hi<|im_end|> there 🎉"


class CountingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call saw."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.sizes.append(len(ids))
        return str(self.inner.decode(ids, **kwargs))


def test_each_push_decodes_a_small_window(smollm_tokenizer: Any) -> None:
    ids = smollm_tokenizer.encode("".join(TEXTS) * 8, add_special_tokens=False)
    assert len(ids) > 500
    counting = CountingTokenizer(smollm_tokenizer)
    prompt = smollm_tokenizer.encode(PROMPT * 20, add_special_tokens=False)
    deltas = stream(counting, ids, prompt)
    assert "".join(deltas) == smollm_tokenizer.decode(ids)
    assert max(counting.sizes) <= 10  # context + an unfinished character, never the whole sequence
    assert len(counting.sizes) <= 2 * len(ids) + 1  # at most two decodes per push


def test_invalid_bytes_are_emitted_once_final_and_the_window_stays_bounded(smollm_tokenizer: Any) -> None:
    # Byte-level tokens for 0x80 (a lone continuation byte): never a valid character.
    lone = smollm_tokenizer.convert_tokens_to_ids("Ģ")
    assert "\ufffd" in smollm_tokenizer.decode([lone])
    ids = smollm_tokenizer.encode("ok ", add_special_tokens=False) + [lone] * 30
    ids += smollm_tokenizer.encode(" end", add_special_tokens=False)
    counting = CountingTokenizer(smollm_tokenizer)
    deltas = stream(counting, ids, [])
    assert "".join(deltas) == smollm_tokenizer.decode(ids)
    assert max(counting.sizes) <= 10


@pytest.mark.parametrize("text", ["Hello world café 🎉 日本 the!", "caf é▁ the world. 𝔘!"])
@pytest.mark.parametrize("chunk", [1, 4])
def test_byte_fallback_tokenizer_with_leading_space_stripping(
    byte_fallback_tokenizer: Any, text: str, chunk: int
) -> None:
    tok = byte_fallback_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # byte-fallback pieces present
    deltas = stream(tok, ids, [], chunk=chunk)
    assert "".join(deltas) == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
    # With a prompt as context, the first word keeps its leading space, as it would mid-text.
    prompt = tok.encode("Hello", add_special_tokens=False)
    with_prompt = "".join(stream(tok, ids, prompt, chunk=chunk))
    assert tok.decode(prompt + ids) == tok.decode(prompt) + with_prompt


def test_push_accepts_an_int_and_ignores_empty(smollm_tokenizer: Any) -> None:
    detok = IncrementalDetokenizer(smollm_tokenizer, [])
    ids = smollm_tokenizer.encode("abc def", add_special_tokens=False)
    assert detok.push([]) == ""
    for t in ids:
        detok.push(t)
    assert detok.text == "abc def" and detok.num_pending_tokens == 0


def test_flush_releases_an_unfinished_character(smollm_tokenizer: Any) -> None:
    ids = smollm_tokenizer.encode("ok 🎉", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte never arrives
    detok = IncrementalDetokenizer(smollm_tokenizer, [])
    deltas = [detok.push(t) for t in cut]
    assert "".join(deltas) == "ok" and detok.num_pending_tokens > 0
    tail = detok.flush()
    assert tail.startswith(" ") and tail.endswith("\ufffd")
    assert detok.text == smollm_tokenizer.decode(cut)
    assert detok.flush() == "" and detok.num_pending_tokens == 0


def test_a_non_tokenizer_is_refused() -> None:
    with pytest.raises(TypeError, match="tokenizer must be a Hugging Face tokenizer"):
        IncrementalDetokenizer(object(), [])
