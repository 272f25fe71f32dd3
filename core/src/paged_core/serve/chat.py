"""``POST /v1/chat/completions``: the chat template, ``n`` choices, streaming deltas and logprobs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from paged_core.frontend.outputs import CompletionOutput, RequestOutput
from paged_core.sampling.params import SamplingParams
from paged_core.serve import openapi
from paged_core.serve.admission import admit
from paged_core.serve.body import parse_body
from paged_core.serve.constraints import request_constraint
from paged_core.serve.generation import ClientGone, Generation
from paged_core.serve.logprobs import chat_logprobs
from paged_core.serve.params import (
    check_context,
    check_limits,
    max_tokens_param,
    placeholder_max_tokens,
    requested_max_tokens,
    sampling_params,
)
from paged_core.serve.protocol import ChatCompletionRequest
from paged_core.serve.responses import collect, sse, stream_response, usage
from paged_core.serve.state import ServerState, get_state
from paged_core.serve.tools.base import ToolParser
from paged_core.serve.tools.choices import ChoiceStreams, finish_reason, tool_message
from paged_core.serve.tools.validate import template_tools, tool_parser_for

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=[Depends(admit)], openapi_extra=openapi.CHAT_COMPLETIONS)
async def create_chat_completion(request: Request) -> Response:
    """OpenAI's chat completions endpoint."""
    state = get_state(request)
    req = await parse_body(request, ChatCompletionRequest, state.config.max_body_bytes)
    ids, params = await prepare_chat(state, req)
    lora = state.check_model(req.model)  # checked in prepare_chat already: the adapter it names, if any
    parser = tool_parser_for(req, state.config)  # checked in prepare_chat already: None under "none"
    gen = Generation(state, request, "chatcmpl")
    gen.start([ids], [params], req.cache_salt, req.priority, lora=lora)
    model = state.served_name(lora)
    if req.stream:
        return stream_response(gen, _chunks(gen, req, state, parser, ids, model))
    try:
        (out,) = await collect(gen, 1)
    except ClientGone:
        return Response(status_code=499)
    body = {
        "id": gen.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(c, req, state, parser) for c in out.outputs],
        "usage": usage([out]),
    }
    if req.return_token_ids:  # vLLM's places: the prompt's ids on the response, each choice's own on the choice
        body["prompt_token_ids"] = ids
    return JSONResponse(body)


async def prepare_chat(
    state: ServerState, req: ChatCompletionRequest, *, continue_final_message: bool = False
) -> tuple[list[int], SamplingParams]:
    """Check ``req`` and render its messages: the prompt's token ids and its sampling params (400s name the field).

    Shared with the routes of other chat APIs (Anthropic's ``/v1/messages`` converts its body to this request).
    ``continue_final_message`` renders the last (assistant) turn open, for the model to continue it.
    """
    state.check_model(req.model)
    check_limits(req, state.config)
    limit = state.config.max_tokens_limit
    vocab_size = state.engine.facts.vocab_size
    constraint = request_constraint(req)
    # Refuse bad fields, then constraints the grammar engine refuses, before rendering the template.
    sampling_params(req, placeholder_max_tokens(req, limit), vocab_size, constraint)
    await state.grammar.check(constraint)
    # The template only adds text around the contents, so their length alone can prove the chat cannot fit.
    state.tokens.refuse_oversize(sum(len(m.text()) for m in req.messages), state.max_model_len, "messages")
    kwargs = req.chat_template_kwargs
    if continue_final_message:  # set here, after check_limits: clients may not set it through the kwargs
        kwargs = {**(kwargs or {}), "continue_final_message": True}
    generation_prompt = req.add_generation_prompt and not continue_final_message
    tools = template_tools(req)
    ids = await state.tokens.offload(state.tokens.render_chat, req.messages, generation_prompt, kwargs, tools)
    max_tokens = check_context(
        len(ids),
        requested_max_tokens(req),
        state.max_model_len,
        "messages",
        limit=limit,
        max_tokens_param=max_tokens_param(req),
    )
    return ids, sampling_params(req, max_tokens, vocab_size, constraint)


def _top(req: ChatCompletionRequest) -> int:
    return req.top_logprobs or 0


def _choice(
    c: CompletionOutput, req: ChatCompletionRequest, state: ServerState, parser: ToolParser | None = None
) -> dict[str, Any]:
    logprobs = None
    if req.logprobs and c.logprobs is not None:
        logprobs = chat_logprobs(state.tokens, c.token_ids, c.logprobs, _top(req))
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if parser is not None:
        message = tool_message(parser, c.text, req.parallel_tool_calls)
    choice = {
        "index": c.index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason(c.finish_reason, "tool_calls" in message),
        "stop_reason": c.stop_reason,
    }
    if req.return_token_ids:
        choice["token_ids"] = c.token_ids
    return choice


async def _chunks(
    gen: Generation,
    req: ChatCompletionRequest,
    state: ServerState,
    parser: ToolParser | None,
    prompt: list[int],
    model: str,
) -> AsyncIterator[str]:
    """The stream's chunks; with ``return_token_ids`` the first chunk carries ``prompt_token_ids`` and each choice's
    chunks the ``token_ids`` they add (vLLM's shape), every generated id exactly once."""
    created = int(time.time())
    streams = ChoiceStreams(parser, req.parallel_tool_calls) if parser is not None else None
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    with_ids = bool(req.return_token_ids)
    final: RequestOutput | None = None

    def chunk(
        index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None, ids: list[int] | None = None
    ) -> str:
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if with_ids:
            choice["token_ids"] = ids or []
        body: dict[str, Any] = {
            "id": gen.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if include_usage:
            body["usage"] = None
        if with_ids and index == 0 and delta.get("role") == "assistant":
            body["prompt_token_ids"] = prompt
        return sse(body)

    # OpenAI opens every choice with a role-only delta.
    for j in range(req.n):
        yield chunk(j, {"role": "assistant", "content": ""})
    done: set[int] = set()
    async for _, out in gen.events():
        if out.finished:
            final = out
        for c in out.outputs:
            if c.index in done:
                continue
            pending = list(c.new_token_ids) if with_ids else []  # sent with this step's first chunk of the choice
            logprobs = None
            if req.logprobs and c.logprobs is not None and c.new_token_ids:
                entries = c.logprobs[-len(c.new_token_ids) :]
                logprobs = chat_logprobs(state.tokens, c.new_token_ids, entries, _top(req))
            if streams is not None:  # tool calls: the parser decides what is content, and holds back what may not be
                deltas = streams.deltas(c.index, c.new_text, c.finish_reason is not None)
                if logprobs is not None and not deltas:
                    deltas = [{}]
                for k, delta in enumerate(deltas):
                    yield chunk(c.index, delta, logprobs if k == 0 else None, ids=pending)
                    pending = []
            elif c.new_text or logprobs is not None:
                yield chunk(c.index, {"content": c.new_text}, logprobs, ids=pending)
                pending = []
            if c.finish_reason is not None:
                done.add(c.index)
                called = streams is not None and c.index in streams.called
                yield chunk(c.index, {}, None, finish_reason(c.finish_reason, called), ids=pending)
            elif pending:  # tokens without text yet (held back, or part of a character): their ids still go out
                yield chunk(c.index, {}, ids=pending)
    if include_usage and final is not None:
        body = {
            "id": gen.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage([final]),
        }
        yield sse(body)
