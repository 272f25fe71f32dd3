"""Admission control: refuse at once a request that could never run, naming the limit."""

from __future__ import annotations

from collections.abc import Container

from paged_core.config import SchedulerConfig
from paged_core.errors import RequestRejectedError
from paged_core.memory.kv_cache_manager import KVCacheManager
from paged_core.sched.request import Request


def check_admissible(
    req: Request, config: SchedulerConfig, kv: KVCacheManager, live_ids: Container[str], max_len: int | None = None
) -> None:
    """Raise :class:`RequestRejectedError` if ``req`` can never be scheduled.

    Checked up front so that such a request never sits at the head of the
    waiting queue blocking the requests behind it.
    """
    n = req.num_prompt_tokens
    if req.request_id in live_ids:
        raise RequestRejectedError(f"request id {req.request_id!r} is already in use")
    max_model_len = config.require_resolved("check_admissible")
    if n > max_model_len:
        raise RequestRejectedError(
            f"request {req.request_id!r}: prompt has {n} tokens, more than max_model_len={max_model_len}"
        )
    usable = kv.pool.num_usable_blocks
    # ``max_len``: the scheduler's cap, what one request's blocks (every KV-cache group's, lookahead slots
    # included) can reach in the whole cache.
    chunk = 1 + config.num_lookahead_tokens
    if kv.blocks_needed(n, chunk) > usable or (max_len is not None and n > max_len):
        raise RequestRejectedError(
            f"request {req.request_id!r}: prompt of {n} tokens needs {kv.blocks_needed(n, chunk)} blocks of "
            f"{kv.block_size} tokens, but the whole KV cache holds {usable} blocks"
        )
    if not config.enable_chunked_prefill and n > config.max_num_batched_tokens:
        raise RequestRejectedError(
            f"request {req.request_id!r}: prompt of {n} tokens exceeds max_num_batched_tokens="
            f"{config.max_num_batched_tokens} and chunked prefill is off"
        )
