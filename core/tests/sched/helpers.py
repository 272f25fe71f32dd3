"""A tiny driver that plays the model runner for scheduler tests."""

from __future__ import annotations

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.request import Request
from paged_core.sched.scheduler import Scheduler


def make_scheduler(
    num_blocks: int = 64, block_size: int = 4, kv_groups: KVCacheGroups | None = None, **sched: object
) -> Scheduler:
    sched.setdefault("max_model_len", 1024)
    sched.setdefault("max_num_batched_tokens", 64)
    cache = CacheConfig(num_blocks=num_blocks, block_size=block_size)
    return Scheduler(SchedulerConfig(**sched), cache, kv_groups=kv_groups)  # type: ignore[arg-type]


def step(s: Scheduler, token: int = 5) -> SchedulerOutput:
    """Schedule, then sample ``token`` for every row that reached the end of its tokens."""
    out = s.schedule()
    sampled = {
        rid: [token]
        for rid in out.num_scheduled_tokens
        if rid in s.requests and s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens
    }
    s.update_from_output(out, sampled)
    return out


def req(rid: str, n: int, start: int = 0, **kw: object) -> Request:
    return Request(rid, list(range(start, start + n)), **kw)  # type: ignore[arg-type]
