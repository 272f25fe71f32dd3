"""``POST /v1/completions``: text completion, batched prompts, streaming, logprobs and echo."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from paged_core.frontend.outputs import CompletionOutput, RequestOutput
from paged_core.serve import openapi
from paged_core.serve.admission import admit
from paged_core.serve.body import parse_body
from paged_core.serve.constraints import request_constraint
from paged_core.serve.errors import APIError
from paged_core.serve.generation import ClientGone, Generation
from paged_core.serve.logprobs import completion_logprobs
from paged_core.serve.params import (
    beam_params,
    check_context,
    check_limits,
    placeholder_max_tokens,
    requested_max_tokens,
    sampling_params,
)
from paged_core.serve.protocol import CompletionRequest
from paged_core.serve.responses import collect, sse, stream_response, usage
from paged_core.serve.state import ServerState, get_state
from paged_core.serve.token_ids import TokenIdFields

router = APIRouter()


def _prompts(req: CompletionRequest, state: ServerState) -> list[list[int]]:
    """Each prompt as token ids (text is encoded; ids are checked against the vocabulary).

    Blocking (tokenization): run it through ``state.tokens.offload``. A prompt whose size alone proves it
    cannot fit the context is refused before any tokenizing or id checking.
    """
    p = req.prompt
    if isinstance(p, str):
        return [_encode(p, "prompt", state)]
    if not p:
        raise APIError(400, "prompt is empty", param="prompt")
    if isinstance(p[0], int):
        return [_check_ids(p, "prompt", state)]
    if len(p) > state.config.max_prompts:
        raise APIError(400, f"at most {state.config.max_prompts} prompts per request, got {len(p)}", param="prompt")
    out = []
    for i, item in enumerate(p):
        if isinstance(item, str):
            out.append(_encode(item, f"prompt[{i}]", state))
        else:
            out.append(_check_ids(cast(list[int], item), f"prompt[{i}]", state))
    return out


def _encode(text: str, param: str, state: ServerState) -> list[int]:
    state.tokens.refuse_oversize(len(text), state.max_model_len, param)
    return state.tokens.encode(text, param)


def _echoes(prompts: list[list[int]], state: ServerState) -> list[str]:
    return [state.tokens.decode(ids) for ids in prompts]


def _check_ids(ids: list[int], param: str, state: ServerState) -> list[int]:
    check_context(len(ids), None, state.max_model_len, param)  # its length alone may already not fit
    return state.tokens.check_ids(ids, param)


@router.post("/v1/completions", dependencies=[Depends(admit)], openapi_extra=openapi.COMPLETIONS)
async def create_completion(request: Request) -> Response:
    """OpenAI's completions endpoint."""
    state = get_state(request)
    req = await parse_body(request, CompletionRequest, state.config.max_body_bytes)
    lora = state.check_model(req.model)
    check_limits(req, state.config)
    # Validates every field once, before paying for tokenization or computing any token budget.
    limit = state.config.max_tokens_limit
    facts = state.engine.facts
    constraint = request_constraint(req)
    first = sampling_params(req, placeholder_max_tokens(req, limit), facts.vocab_size, constraint)
    beam = beam_params(req, first, facts.max_num_seqs)
    await state.grammar.check(constraint)
    prompts = await state.tokens.offload(_prompts, req, state)
    asked = requested_max_tokens(req, limit)
    budgets = [check_context(len(ids), asked, state.max_model_len, "prompt", limit=limit) for ids in prompts]
    # replace() re-validates: a default budget below min_tokens is refused there, naming min_tokens.
    params = [dataclasses.replace(first, max_tokens=budget) for budget in budgets]
    gen = Generation(state, request, "cmpl")
    gen.start(prompts, params, req.cache_salt, req.priority, beam=beam, lora=lora)
    echoes = await state.tokens.offload(_echoes, prompts, state) if req.echo else [""] * len(prompts)
    if req.stream:
        return stream_response(gen, _chunks(gen, req, state, echoes, prompts, state.served_name(lora)))
    try:
        outputs = await collect(gen, len(prompts))
    except ClientGone:
        return Response(status_code=499)
    choices = [
        _choice(i * req.n + c.index, c, echoes[i], req, state, prompts[i])
        for i, out in enumerate(outputs)
        for c in out.outputs
    ]
    body = {
        "id": gen.id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.served_name(lora),
        "choices": choices,
        "usage": usage(outputs),
    }
    return JSONResponse(body)


def _choice(
    index: int, c: CompletionOutput, echo: str, req: CompletionRequest, state: ServerState, prompt: list[int]
) -> dict[str, Any]:
    logprobs = None
    if req.logprobs is not None and c.logprobs is not None:
        logprobs = completion_logprobs(state.tokens, c.token_ids, c.logprobs, req.logprobs, len(echo))
    choice: dict[str, Any] = {
        "index": index,
        "text": echo + c.text,
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if req.return_token_ids:  # vLLM's places: both on the choice (each choice has its own prompt here)
        choice["prompt_token_ids"] = prompt
        choice["token_ids"] = c.token_ids
    return choice


async def _chunks(
    gen: Generation,
    req: CompletionRequest,
    state: ServerState,
    echoes: list[str],
    prompts: list[list[int]],
    model: str,
) -> AsyncIterator[str]:
    """The stream's chunks; with ``return_token_ids`` each choice's first chunk carries its ``prompt_token_ids``
    and every chunk the ``token_ids`` it adds (vLLM's shape)."""
    created = int(time.time())
    ids = TokenIdFields(prompts, req.n) if req.return_token_ids else None
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    finals: dict[int, RequestOutput] = {}
    sent_finish: set[int] = set()
    offsets: dict[int, int] = {}
    for i, echo in enumerate(echoes):  # an echoed prompt goes out first, as its own chunk per choice
        for j in range(req.n if echo else 0):
            offsets[i * req.n + j] = len(echo)
            body = _chunk(gen.id, created, model, i * req.n + j, echo, None, None, include_usage)
            yield sse(ids.add(body, i * req.n + j, []) if ids is not None else body)
    async for i, out in gen.events():
        if out.finished:
            finals[i] = out
        for c in out.outputs:
            index = i * req.n + c.index
            if index in sent_finish or not (c.new_text or c.new_token_ids or c.finish_reason):
                continue
            logprobs = None
            if req.logprobs is not None and c.logprobs is not None and c.new_token_ids:
                entries = c.logprobs[-len(c.new_token_ids) :]
                logprobs = completion_logprobs(
                    state.tokens, c.new_token_ids, entries, req.logprobs, offsets.get(index, 0)
                )
            offsets[index] = offsets.get(index, 0) + len(c.new_text)
            if c.finish_reason is not None:
                sent_finish.add(index)
            body = _chunk(gen.id, created, model, index, c.new_text, logprobs, c.finish_reason, include_usage)
            yield sse(ids.add(body, index, c.new_token_ids) if ids is not None else body)
    if include_usage:
        body = {
            "id": gen.id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(finals[i] for i in sorted(finals)),
        }
        yield sse(body)


def _chunk(
    rid: str,
    created: int,
    model: str,
    index: int,
    text: str,
    logprobs: dict[str, Any] | None,
    finish: str | None,
    include_usage: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }
    if include_usage:
        body["usage"] = None
    return body
