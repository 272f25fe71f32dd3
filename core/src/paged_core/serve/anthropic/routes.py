"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API over the chat route's pieces.

The body becomes a chat completion request (:func:`.convert.convert`) that goes through the chat route's own
checks, template and tool-call parser choice (:func:`~paged_core.serve.chat.prepare_chat`,
:func:`~paged_core.serve.tools.validate.tool_parser_for`) and runs as one
:class:`~paged_core.serve.generation.Generation`; errors come back in Anthropic's shape (:mod:`.errors`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paged_core.serve.admission import admit
from paged_core.serve.anthropic.convert import content_blocks, continues, convert, message_body, stop_reason
from paged_core.serve.anthropic.errors import PATH, anthropic_body
from paged_core.serve.anthropic.protocol import CountTokensRequest, MessagesRequest
from paged_core.serve.anthropic.stream import MessageEvents, sse_event
from paged_core.serve.body import parse_body
from paged_core.serve.chat import prepare_chat
from paged_core.serve.errors import APIError, internal_error
from paged_core.serve.generation import ClientGone, Generation
from paged_core.serve.responses import collect
from paged_core.serve.state import get_state
from paged_core.serve.tools.choices import ChoiceStreams
from paged_core.serve.tools.validate import template_tools, tool_parser_for

router = APIRouter()


# Not in the OpenAPI document yet: its schema test holds every documented route to OpenAI's error shape.
@router.post(PATH, dependencies=[Depends(admit)], include_in_schema=False)
async def create_message(request: Request) -> Response:
    """Anthropic's Messages endpoint: a conversation in, one assistant message (text and tool calls) out, whole or
    as an event stream."""
    state = get_state(request)
    req = await parse_body(request, MessagesRequest, state.config.max_body_bytes)
    converted = convert(req)
    try:
        ids, params = await prepare_chat(state, converted.chat, continue_final_message=continues(req))
        parser = tool_parser_for(converted.chat, state.config)  # checked in prepare_chat: None under "none"
    except APIError as exc:
        raise converted.renamed(exc) from None
    lora = state.check_model(req.model)  # checked in prepare_chat: the LoRA adapter it names, if any
    model = state.served_name(lora)
    parallel = converted.chat.parallel_tool_calls
    gen = Generation(state, request, "msg")
    message_id = "msg_" + gen.id.removeprefix("msg-")
    gen.start([ids], [params], None, lora=lora)
    if req.stream:
        streams = ChoiceStreams(parser, parallel) if parser is not None else None
        return _stream(gen, _events(gen, MessageEvents(message_id, model, len(ids)), streams))
    try:
        (out,) = await collect(gen, 1)
    except ClientGone:
        return Response(status_code=499)
    c = out.outputs[0]
    blocks = content_blocks(c.text, parser, parallel)
    called = any(b["type"] == "tool_use" for b in blocks)
    body = message_body(message_id, model, blocks, stop_reason(c, called), len(ids), len(c.token_ids))
    return JSONResponse(body)


@router.post(f"{PATH}/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> JSONResponse:
    """``{"input_tokens": N}``: the prompt's length through the chat template (tools included), as
    ``/v1/messages`` would send it."""
    state = get_state(request)
    req = await parse_body(request, CountTokensRequest, state.config.max_body_bytes)
    state.check_model(req.model)
    converted = convert(req)
    messages = converted.chat.messages
    state.tokens.refuse_oversize(sum(len(m.text()) for m in messages), state.max_model_len, "messages")
    prefill = continues(req)
    extra = {"continue_final_message": True} if prefill else None
    tools = template_tools(converted.chat)
    try:
        ids = await state.tokens.offload(state.tokens.render_chat, messages, not prefill, extra, tools)
    except APIError as exc:
        raise converted.renamed(exc) from None
    return JSONResponse({"input_tokens": len(ids)})


async def _events(gen: Generation, events: MessageEvents, streams: ChoiceStreams | None) -> AsyncIterator[str]:
    """The message's events; with tool calls, the parser decides what is text and holds back what may be a call."""
    for event in events.start():
        yield sse_event(event)
    async for _, out in gen.events():
        c = out.outputs[0]
        finished = c.finish_reason is not None
        if streams is None:
            new = events.text(c.new_text)
        else:
            new = events.pieces(streams.pieces(0, c.new_text, finished))
        for event in new:
            yield sse_event(event)
        if finished:
            reason, sequence = stop_reason(c, events.called)
            for event in events.finish(reason, sequence, len(c.token_ids)):
                yield sse_event(event)


def _stream(gen: Generation, chunks: AsyncIterator[str]) -> StreamingResponse:
    """Stream ``chunks``; a failure mid-stream becomes Anthropic's ``error`` event (there is no ``[DONE]``)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        except ClientGone:
            return  # nobody is listening; the request was aborted already
        except Exception as exc:
            error = exc if isinstance(exc, APIError) else internal_error(exc, f"stream {gen.id}")
            yield sse_event(anthropic_body(error))
        finally:
            gen.close()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
