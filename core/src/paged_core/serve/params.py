"""From an OpenAI request to :class:`SamplingParams`, with the server's limits applied and named."""

from __future__ import annotations

from typing import Any

from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import MAX_LOGPROBS, SamplingParams
from paged_core.serve.config import ServeConfig
from paged_core.serve.errors import APIError, rejected
from paged_core.serve.protocol import ChatCompletionRequest, CompletionRequest


def check_limits(req: CompletionRequest | ChatCompletionRequest, config: ServeConfig) -> None:
    """Refuse ``n`` and ``max_tokens`` beyond the server's caps, and unsupported OpenAI features."""
    if req.n > config.max_n:
        raise APIError(400, f"n must be at most {config.max_n} on this server, got {req.n}", param="n")
    max_tokens = requested_max_tokens(req)
    limit = config.max_tokens_limit
    if max_tokens is not None and limit is not None and max_tokens > limit:
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
        raise APIError(400, f"{name} must be at most {limit} on this server, got {max_tokens}", param=name)
    if req.logit_bias:
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    if isinstance(req, CompletionRequest):
        if req.suffix is not None:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported (only best_of == n)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported (no prompt logprobs)", param="echo")
    else:
        if req.tools:
            raise APIError(400, "tools are not supported", param="tools")
        kind = (req.response_format or {}).get("type", "text")
        if kind != "text":
            raise APIError(400, f"response_format type {kind!r} is not supported (only 'text')",
                           param="response_format")  # fmt: skip


def requested_max_tokens(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """``max_completion_tokens`` (chat) wins over ``max_tokens``; None means 'up to the context length'."""
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


def check_context(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, param: str) -> int:
    """The ``max_tokens`` to use; refuses a prompt that leaves no room, or prompt + max_tokens beyond the context."""
    if num_prompt_tokens >= max_model_len:
        raise APIError(
            400, f"this model's maximum context length is {max_model_len} tokens; {num_prompt_tokens} tokens in the "
            f"{param} leave no room to generate", param=param, code="context_length_exceeded",
        )  # fmt: skip
    room = max_model_len - num_prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise APIError(
            400, f"this model's maximum context length is {max_model_len} tokens, but {num_prompt_tokens + max_tokens}"
            f" were requested ({num_prompt_tokens} in the {param}, {max_tokens} for the completion); "
            "reduce the prompt or max_tokens", param="max_tokens", code="context_length_exceeded",
        )  # fmt: skip
    return max_tokens


def sampling_params(req: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    """The engine's :class:`SamplingParams`; a bad value becomes a 400 naming the field."""
    if isinstance(req, ChatCompletionRequest):
        logprobs = _chat_logprobs(req)
    else:
        logprobs = req.logprobs
    fields: dict[str, Any] = {
        "n": req.n, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty, "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty, "seed": req.seed, "stop": req.stop,
        "stop_token_ids": req.stop_token_ids, "max_tokens": max_tokens, "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos, "logprobs": logprobs, "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
    }  # fmt: skip
    # Unset OpenAI fields take SamplingParams' defaults (the OpenAI defaults: temperature 1, top_p 1).
    given = {k: v for k, v in fields.items() if v is not None or k in ("seed", "logprobs", "stop")}
    try:
        return SamplingParams(**given)
    except RequestRejectedError as exc:
        raise rejected(exc) from None


def _chat_logprobs(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {req.top_logprobs}",
                           param="top_logprobs")  # fmt: skip
        return req.top_logprobs
    return 0 if req.logprobs else None
