"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``: vLLM's runtime adapter routes.

Mounted only with ``--enable-lora-runtime-updates`` (or vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), as vLLM
does: without it both paths are unknown routes (404). A load lets a client make the server read any directory it
can, hence off by default. Success is a 200 with a plain-text line, as vLLM answers; errors are OpenAI's JSON.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from paged_core.serve import openapi
from paged_core.serve.body import parse_body
from paged_core.serve.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from paged_core.serve.state import get_state

router = APIRouter()


@router.post("/v1/load_lora_adapter", openapi_extra=openapi.LOAD_LORA)
async def load_lora_adapter(request: Request) -> PlainTextResponse:
    """Load and check the PEFT adapter at ``lora_path`` now, then serve it as the model ``lora_name``."""
    state = get_state(request)
    req = await parse_body(request, LoadLoRAAdapterRequest, state.config.max_body_bytes)
    lora = await state.loras.load(req.lora_name, req.lora_path)
    return PlainTextResponse(f"LoRA adapter '{lora.name}' loaded (id {lora.id})")


@router.post("/v1/unload_lora_adapter", openapi_extra=openapi.UNLOAD_LORA)
async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    """Stop serving the adapter ``lora_name``; requests already running on it finish on it."""
    state = get_state(request)
    req = await parse_body(request, UnloadLoRAAdapterRequest, state.config.max_body_bytes)
    lora = await state.loras.unload(req.lora_name)
    running = state.loras.in_use(lora)
    later = f"; the engine forgets it when the {running} request(s) running on it end" if running else ""
    return PlainTextResponse(f"LoRA adapter '{lora.name}' unloaded{later}")
