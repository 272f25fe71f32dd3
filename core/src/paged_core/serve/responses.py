"""Pieces shared by the completion routes: SSE framing, usage, and the streaming response wrapper."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

from paged_core.frontend.outputs import RequestOutput
from paged_core.serve.errors import APIError, internal_error
from paged_core.serve.generation import ClientGone, Generation


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying ``data`` as compact JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


def usage(outputs: Iterable[RequestOutput]) -> dict[str, Any]:
    """OpenAI usage, with prefix-cache hits reported as ``prompt_tokens_details.cached_tokens``."""
    prompt = completion = cached = 0
    for out in outputs:
        prompt += len(out.prompt_token_ids)
        completion += sum(len(c.token_ids) for c in out.outputs)
        cached += out.metrics.num_cached_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def collect(gen: Generation, count: int) -> list[RequestOutput]:
    """The final output of each of ``count`` prompts (non-streaming requests)."""
    final: list[RequestOutput | None] = [None] * count
    try:
        async for i, out in gen.events():
            if out.finished:
                final[i] = out
    finally:
        gen.close()
    if any(o is None for o in final):
        raise internal_error(RuntimeError("a request ended without a final output"), f"request {gen.id}")
    return [o for o in final if o is not None]


def stream_response(gen: Generation, chunks: AsyncIterator[str]) -> StreamingResponse:
    """Stream ``chunks`` as SSE ending in ``[DONE]``; a failure mid-stream becomes an error event."""

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        except ClientGone:
            return  # nobody is listening; the requests were aborted already
        except Exception as exc:
            # An APIError is meant for the client (and a 500 one was logged with its id where it was made).
            err = exc if isinstance(exc, APIError) else internal_error(exc, f"stream {gen.id}")
            yield sse(err.body())
        finally:
            gen.close()
        yield DONE

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
