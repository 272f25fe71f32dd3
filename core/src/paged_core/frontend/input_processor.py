"""InputProcessor: prompts (text or ids) and chat conversations to validated :class:`CoreRequest`\\ s.

One input path for :class:`~paged_core.frontend.llm.LLM`, the CLI and the server: every refusal is an
:class:`InputError` naming the field, which the server turns into a 400 with the same message.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paged_core.engine_core.beam_params import BeamParams, BeamRequestError, check_beam
from paged_core.engine_core.messages import CoreFacts, CoreRequest
from paged_core.errors import RequestRejectedError
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import INT64_MAX, INT64_MIN, SamplingParams

Message = Mapping[str, Any]

PROMPT_KINDS = "text (str) or a list of token ids (int)"
"""What a prompt may be, for refusals: "<prompt> must be {PROMPT_KINDS}; <what it is>"."""


def is_token_id_type(value: object) -> bool:
    """True for an integer that can be a token id: a Python or numpy int; never a bool (True is not token 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def prompt_type_problem(prompt: object) -> str | None:
    """What makes ``prompt`` neither text nor token ids, naming its type; ``None`` when it is one of them.

    Token ids are a list, a tuple or a 1-D numpy array of integers (:func:`is_token_id_type`); their range is
    checked later, against the vocabulary. Bytes are refused rather than read as ids (decode them to text).
    """
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        return f"got {type(prompt).__name__} (decode it to text first)"
    if isinstance(prompt, Mapping):
        is_message = "role" in prompt and "content" in prompt
        return f"got {type(prompt).__name__}" + (" (a chat message: use chat())" if is_message else "")
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        return f"got a {prompt.ndim}-D numpy array"
    if not isinstance(prompt, (list, tuple, np.ndarray)):
        return f"got {type(prompt).__name__}"
    for j, token in enumerate(prompt):
        if not is_token_id_type(token):
            return f"got a {type(prompt).__name__} whose item {j} is {type(token).__name__}"
    return None


class InputError(RequestRejectedError):
    """A request's input is refused; ``param`` names the field (``prompt``, ``messages``, ``priority``...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InputProcessor:
    """Tokenizes and validates requests against one core's facts (vocabulary, EOS ids)."""

    def __init__(self, tokenizer: Any | None, facts: CoreFacts) -> None:
        self.tokenizer = tokenizer
        self.facts = facts
        self.vocab_size = facts.vocab_size

    # ---- pieces (the server calls these off its event loop) ----------------
    def encode(self, text: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; empty text, a model without a tokenizer, an empty encoding and ids outside the
        vocabulary (a tokenizer larger than the model's embedding) are refused."""
        if not text:
            raise InputError(f"{param} is empty", param)
        if self.tokenizer is None:
            raise InputError(f"{param}: this model has no tokenizer; send token ids instead of text", param)
        ids = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=add_special_tokens)]
        if not ids:
            raise InputError(f"{param} encodes to no tokens", param)
        return self.check_ids(ids, param)

    def check_ids(self, ids: Sequence[Any], param: str = "prompt") -> list[int]:
        """``ids`` as a list if every one is a valid token id; else refused naming the bad ones."""
        if not ids:
            raise InputError(f"{param} is empty", param)
        vocab = self.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise InputError(f"{param}: token ids must be in [0, {vocab}); got {bad[:5]!r}", param)
        return list(ids)

    def tokenize(self, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
        """Token ids of a prompt given as text or as ids; anything else is refused naming its type.

        Ids may be Python or numpy ints (see :func:`prompt_type_problem`); they come back as Python ints.
        """
        if isinstance(prompt, str):
            return self.encode(prompt, param)
        problem = prompt_type_problem(prompt)
        if problem is not None:
            raise InputError(f"{param} must be {PROMPT_KINDS}; {problem}", param)
        return self.check_ids([int(t) for t in prompt], param)

    def render_chat(
        self,
        conversation: Sequence[Message],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a conversation (``{"role", "content"}`` dicts) through the model's chat template."""
        from jinja2 import TemplateError

        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise InputError("this model has no chat template; send a plain prompt instead", "messages")
        for i, m in enumerate(conversation):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise InputError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}", "messages")
        try:
            ids = tok.apply_chat_template(
                list(conversation),
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                **dict(chat_template_kwargs or {}),
            )
        except TemplateError as exc:  # the model's template refuses this conversation, saying why
            raise InputError(f"the chat template refused these messages: {exc}", "messages") from None
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return self.check_ids([int(t) for t in ids], "messages")

    # ---- whole requests -------------------------------------------------
    def process(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        cache_salt: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        beam: BeamParams | None = None,
        lora: LoRARequest | None = None,
    ) -> CoreRequest:
        """A :class:`CoreRequest` with everything a step computes with bounded.

        ``params`` are checked against the vocabulary (stop token ids inside it; a ``top_k`` above it
        is clamped to it, which keeps the same tokens) and ``priority`` must fit int64. With ``beam``, the
        request is a beam search and its params must be ones it can honour (see :func:`check_beam`).
        """
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InputError(f"sampling params must be a SamplingParams, got {type(params).__name__}", "params")
        if not isinstance(priority, int) or isinstance(priority, bool) or not INT64_MIN <= priority <= INT64_MAX:
            shown = priority if isinstance(priority, int) and abs(priority) < 10**40 else type(priority).__name__
            raise InputError(f"priority must be an int in [-2**63, 2**63 - 1]; got {shown!r}", "priority")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise InputError(f"cache_salt must be a string, got {type(cache_salt).__name__}", "cache_salt")
        if lora is not None and not isinstance(lora, LoRARequest):
            raise InputError(f"lora_request must be a LoRARequest, got {type(lora).__name__}", "lora_request")
        params = params.for_vocabulary(self.vocab_size)
        if beam is not None:
            try:
                check_beam(params, beam, self.facts.max_num_seqs)
            except BeamRequestError as exc:
                raise InputError(str(exc), exc.param) from None
        ids = self.tokenize(prompt)
        when = time.monotonic() if arrival_time is None else arrival_time
        return CoreRequest(request_id, ids, params, cache_salt, priority, when, beam=beam, lora=lora)
