"""From an OpenAI request to :class:`SamplingParams`, with the server's limits applied and named."""

from __future__ import annotations

import json
import math
from typing import Any

from paged_core.engine_core.beam_params import BeamParams, BeamRequestError, check_beam
from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import INT64_MAX, INT64_MIN, MAX_LOGPROBS, SamplingParams
from paged_core.serve.constraints import Constraint, constraint_source
from paged_core.serve.errors import APIError, rejected
from paged_core.serve.protocol import ChatCompletionRequest, CompletionRequest
from paged_core.serve.settings import ServeConfig
from paged_core.serve.tools.validate import tool_parser_for

MAX_TEMPLATE_KWARGS_BYTES = 4096
# apply_chat_template's own parameters and the template's special-token variables (see check_template_kwargs).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
        "extra_special_tokens",
    }
)


def check_limits(req: CompletionRequest | ChatCompletionRequest, config: ServeConfig) -> None:
    """Refuse ``n`` and ``max_tokens`` beyond the server's caps, and unsupported OpenAI features."""
    if req.n > config.max_n:
        raise APIError(400, f"n must be at most {config.max_n} on this server, got {req.n}", param="n")
    limit = config.max_tokens_limit
    max_tokens = requested_max_tokens(req, limit)
    if max_tokens is not None and limit is not None and max_tokens > limit:
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
        raise APIError(400, f"{name} must be at most {limit} on this server, got {max_tokens}", param=name)
    if req.logit_bias:
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    check_priority(req.priority)
    if isinstance(req, CompletionRequest):
        if req.suffix is not None:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported (only best_of == n)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported (no prompt logprobs)", param="echo")
    else:
        tool_parser_for(req, config)  # tools and tool_choice, refused here before any rendering
        check_template_kwargs(req.chat_template_kwargs)


def beam_params(req: CompletionRequest, params: SamplingParams, max_num_seqs: int) -> BeamParams | None:
    """vLLM's ``use_beam_search``: width ``n``, every beam returned; None when not asked for. Refusals name the field.

    Beams are only final when the search ends, so they cannot stream; the sampling fields must be ones beam
    search can honour (see :func:`~paged_core.engine_core.beam_params.check_beam`).
    """
    if not req.use_beam_search:
        for name in ("length_penalty", "early_stopping"):
            if name in req.model_fields_set:
                raise APIError(400, f"{name} applies to beam search only; set use_beam_search true", param=name)
        return None
    if params.structured_outputs is not None:
        source = constraint_source(req)
        raise APIError(
            400,
            f"{source} cannot be used with use_beam_search: beams cannot follow a grammar; "
            "sample with the constraint instead",
            param=source,
        )
    if req.stream:
        raise APIError(
            400,
            "stream=true is not supported with use_beam_search: beams are reordered until the search "
            "ends, so they come back whole; set stream false",
            param="stream",
        )
    beam = BeamParams(req.n, req.length_penalty, req.early_stopping)
    try:
        check_beam(params, beam, max_num_seqs)
    except BeamRequestError as exc:
        param = "n" if exc.param == "beam_width" else exc.param
        message = str(exc).replace("beam_width", "n (the beam width)", 1) if exc.param == "beam_width" else str(exc)
        raise APIError(400, message, param=param) from None
    return beam


def check_priority(priority: int) -> None:
    """A 400 unless ``priority`` fits the engine's int64 (the body's schema only makes it an int)."""
    if not INT64_MIN <= priority <= INT64_MAX:
        shown = priority if abs(priority) < 10**40 else "int"
        raise APIError(400, f"priority must be an int in [-2**63, 2**63 - 1]; got {shown!r}")


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    """Refuse ``chat_template_kwargs`` that could do more than set a flag of the model's template.

    The server renders only the model's own template: a client template is arbitrary code to run (a loop of
    ``range(10**9)`` freezes rendering), so ``chat_template`` is refused. The other names refused are
    ``apply_chat_template``'s own parameters (tokenize, return_tensors... would change what it returns) and
    the special-token variables (a client ``bos_token`` would put arbitrary control text into the prompt).
    Values are flat scalars within :data:`MAX_TEMPLATE_KWARGS_BYTES` of JSON: real templates read flags like
    ``enable_thinking``, and lists or long strings would only feed loops in the template.
    """
    if not kwargs:
        return
    if "chat_template" in kwargs:
        raise APIError(
            400,
            "chat_template_kwargs.chat_template is not accepted: this server only renders the "
            "model's own chat template",
            param="chat_template_kwargs",
        )
    size = len(json.dumps(kwargs, ensure_ascii=False).encode())
    if size > MAX_TEMPLATE_KWARGS_BYTES:
        raise APIError(
            400,
            f"chat_template_kwargs is {size} bytes of JSON; at most {MAX_TEMPLATE_KWARGS_BYTES} are accepted",
            param="chat_template_kwargs",
        )
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise APIError(
            400,
            f"chat_template_kwargs may not set {', '.join(reserved)} (reserved by the server)",
            param="chat_template_kwargs",
        )
    for key, value in kwargs.items():
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, float) and not math.isfinite(value)):
            raise APIError(
                400,
                f"chat_template_kwargs.{key} must be a string, number or boolean, got {type(value).__name__}",
                param="chat_template_kwargs",
            )


def requested_max_tokens(req: CompletionRequest | ChatCompletionRequest, limit: int | None = None) -> int | None:
    """The completion budget asked for; None means 'fill the context' (within ``limit``, see check_context).

    Chat's ``max_completion_tokens`` wins over ``max_tokens``. A completion that omits ``max_tokens`` gets
    OpenAI's default of 16, lowered to the server's ``limit``: the client did not ask for more.
    """
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    if isinstance(req, CompletionRequest) and "max_tokens" not in req.model_fields_set and limit is not None:
        return None if req.max_tokens is None else min(req.max_tokens, limit)
    return req.max_tokens


def check_context(
    num_prompt_tokens: int,
    max_tokens: int | None,
    max_model_len: int,
    param: str,
    *,
    limit: int | None = None,
    max_tokens_param: str = "max_tokens",
) -> int:
    """The ``max_tokens`` to use; refuses a prompt that leaves no room, or prompt + max_tokens beyond the context.

    An omitted ``max_tokens`` (None) fills the context, but never beyond the server's ``limit``
    (``--max-tokens-limit``): a cap that omitting the field could escape would cap nothing.
    ``max_tokens_param`` is the field the client sent (chat's ``max_completion_tokens``), named in errors.
    """
    if num_prompt_tokens >= max_model_len:
        raise APIError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; {num_prompt_tokens} tokens in the "
            f"{param} leave no room to generate",
            param=param,
            code="context_length_exceeded",
        )
    room = max_model_len - num_prompt_tokens
    if max_tokens is None:
        return room if limit is None else min(room, limit)
    if max_tokens > room:
        raise APIError(
            400,
            f"this model's maximum context length is {max_model_len} tokens, but {num_prompt_tokens + max_tokens}"
            f" were requested ({num_prompt_tokens} in the {param}, {max_tokens} for the completion); "
            f"reduce the prompt or {max_tokens_param}",
            param=max_tokens_param,
            code="context_length_exceeded",
        )
    return max_tokens


def max_tokens_param(req: CompletionRequest | ChatCompletionRequest) -> str:
    """The name of the token-budget field the client sent (chat's ``max_completion_tokens`` wins)."""
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return "max_completion_tokens"
    return "max_tokens"


def placeholder_max_tokens(req: CompletionRequest | ChatCompletionRequest, limit: int | None = None) -> int:
    """A ``max_tokens`` for validating the sampling fields before the prompt's length is known.

    The client's own value when it sent one (so ``min_tokens > max_tokens`` is still refused up front), else
    one that cannot conflict with ``min_tokens``: a fixed 1 would refuse every ``min_tokens`` of 2 or more.
    """
    given = requested_max_tokens(req, limit)
    if given is not None:
        return given
    return max(1, req.min_tokens)


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    max_tokens: int,
    vocab_size: int,
    constraint: Constraint | None = None,
) -> SamplingParams:
    """The engine's :class:`SamplingParams`, bounded by the vocabulary (stop ids inside it, ``top_k`` clamped to it:
    see :meth:`SamplingParams.for_vocabulary`); a bad value becomes a 400 naming the field. ``constraint`` (from
    :func:`~paged_core.serve.constraints.request_constraint`) becomes ``structured_outputs``.

    The server's one check of these fields: neither the engine nor an in-process core checks them again.
    """
    if isinstance(req, ChatCompletionRequest):
        logprobs = _chat_logprobs(req)
    else:
        logprobs = req.logprobs
    fields: dict[str, Any] = {
        "n": req.n,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "seed": req.seed,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "max_tokens": max_tokens,
        "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "logprobs": logprobs,
        "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "speculate": req.speculate,
        "structured_outputs": None if constraint is None else constraint.spec,
    }
    if isinstance(req, CompletionRequest) and req.use_beam_search and req.temperature is None:
        fields["temperature"] = 0.0  # beam search is deterministic: an unset temperature is no conflict
    # Unset OpenAI fields take SamplingParams' defaults (the OpenAI defaults: temperature 1, top_p 1).
    given = {k: v for k, v in fields.items() if v is not None or k in ("seed", "logprobs", "stop")}
    try:
        return SamplingParams(**given).for_vocabulary(vocab_size)
    except RequestRejectedError as exc:
        error = rejected(exc)
        if error.param == "max_tokens":  # name the field the client actually sent
            error.param = max_tokens_param(req)
        raise error from None


def _chat_logprobs(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise APIError(
                400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {req.top_logprobs}", param="top_logprobs"
            )
        return req.top_logprobs
    return 0 if req.logprobs else None
