"""Tokenizer use on the server: prompts, chat templates, and token strings/bytes for logprobs.

Tokenizing and rendering a chat template take time proportional to the input, so routes run them through
:meth:`Tokens.offload`, on a small thread pool, never on the event loop. Measured with SmolLM2's HF fast
tokenizer (tokenizers 0.23): encoding 3 MiB takes about 6 s and releases the GIL while it runs (the event
loop's longest pause meanwhile was 60 ms), so the pool keeps the loop serving; the size pre-check
(:meth:`Tokens.refuse_oversize`) is what keeps a client from spending those seconds of a core at will.
Jinja rendering is pure Python and shares the GIL, which is why client templates are refused outright.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from paged_core.frontend.input_processor import InputError, InputProcessor
from paged_core.serve.errors import APIError
from paged_core.serve.protocol import ChatMessage
from paged_core.serve.tokenizer_facts import control_tokens, max_chars_per_token
from paged_core.serve.tools.template import message_texts, template_message, tool_texts

P = ParamSpec("P")
T = TypeVar("T")
# Two workers: one long tokenization does not hold up the next request's, and the cores stay with the engine.
WORKERS = 2


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


def _as_api_error(exc: InputError) -> APIError:
    return APIError(400, str(exc), param=exc.param)


class Tokens:
    """The server's use of the front end's :class:`InputProcessor` (refusals become 400s), plus logprob pieces."""

    def __init__(
        self, inputs: InputProcessor, *, allow_special_in_content: bool = False, chat_template: str | None = None
    ) -> None:
        tokenizer = inputs.tokenizer
        self.chat_template = chat_template
        """The server's chat template (``--chat-template``) in place of the model's; None keeps the model's."""
        self.inputs = inputs
        self.tokenizer = tokenizer
        self.vocab_size = inputs.vocab_size
        self._text: dict[int, tuple[str, list[int]]] = {}
        self._byte_level = _is_byte_level(tokenizer)
        self.chars_per_token = max_chars_per_token(tokenizer, self._byte_level)
        self.control_tokens = () if allow_special_in_content else control_tokens(tokenizer, chat_template)
        self._control = re.compile("|".join(map(re.escape, self.control_tokens))) if self.control_tokens else None
        self._pool: ThreadPoolExecutor | None = None  # made on first use, so an app can start again after close

    async def offload(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the tokenizer pool, so the event loop keeps serving meanwhile."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="paged-tokens")
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the pool (queued work is dropped; running work finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def refuse_oversize(self, num_chars: int, max_model_len: int, param: str) -> None:
        """A 400 when ``num_chars`` of text need more than ``max_model_len`` tokens whatever they say.

        Checked before tokenizing, so a huge prompt costs nothing: see :func:`max_chars_per_token` for why
        the bound holds. Tokenizers without a bound skip it (their prompts are still tokenized off the loop).
        """
        bound = self.chars_per_token
        if bound is not None and num_chars > bound * max_model_len:
            raise APIError(
                400,
                f"this model's maximum context length is {max_model_len} tokens, and the {num_chars} characters "
                f"in the {param} need more than that (one token covers at most {bound} characters here)",
                param=param,
                code="context_length_exceeded",
            )

    def check_content(self, texts: Iterable[tuple[str, str]], param: str) -> None:
        """A 400 when a text (named by the first item of each pair) contains a control token's text."""
        if self._control is None:
            return
        for where, text in texts:
            match = self._control.search(text)
            if match is not None:
                raise APIError(
                    400,
                    f"{where} contains the control token {match.group()!r}; this server refuses control-token "
                    "text in chat content so that it cannot forge chat turns (the operator can allow it with "
                    "--allow-special-tokens-in-content)",
                    param=param,
                )

    def require(self, what: str) -> Any:
        """The tokenizer, or a 400 saying that ``what`` needs one."""
        if self.tokenizer is None:
            raise APIError(400, f"{what} needs a tokenizer, and this model has none; send token ids instead")
        return self.tokenizer

    def encode(self, text: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; an empty result is a 400."""
        self.require("a text prompt")
        try:
            return self.inputs.encode(text, param, add_special_tokens)
        except InputError as exc:
            raise _as_api_error(exc) from None

    def check_ids(self, ids: Sequence[int], param: str) -> list[int]:
        """``ids`` if every one is a valid token id; else a 400 naming the bad ones."""
        try:
            return self.inputs.check_ids(ids, param)
        except InputError as exc:
            raise _as_api_error(exc) from None

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a conversation (and the ``tools`` it may call) through the model's chat template (blocking:
        run it through offload)."""
        tok = self.require("chat")
        if not (self.chat_template or getattr(tok, "chat_template", None)):
            raise APIError(400, "this model has no chat template; use /v1/completions with a plain prompt")
        conv = [template_message(i, m) for i, m in enumerate(messages)]
        self.check_content(message_texts(conv), "messages")
        kwargs = dict(extra or {})
        if tools:
            self.check_content(tool_texts(tools), "tools")
            kwargs["tools"] = list(tools)  # after the kwargs check: a client cannot set it through them
        self.check_content(
            ((f"chat_template_kwargs.{k}", v) for k, v in kwargs.items() if isinstance(v, str)), "chat_template_kwargs"
        )
        if self.chat_template:  # the server's own (clients cannot set it: see params.check_template_kwargs)
            kwargs["chat_template"] = self.chat_template
        try:
            return self.inputs.render_chat(conv, add_generation_prompt, kwargs)
        except InputError as exc:
            raise _as_api_error(exc) from None

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
