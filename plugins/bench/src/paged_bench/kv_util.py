"""``kv-util``: the real scheduler and KV manager against the reservation baseline, on one KV budget.

No model runs: each step the scheduler plans as it would in the engine,
and every request that reached the end of its known tokens is handed one
made-up sampled token. What is measured (slots allocated, slots holding
real tokens, requests running) depends only on the lengths, so simulated
tokens give the same figures as a real model would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from paged_bench.reservation import simulate_reserved
from paged_bench.trace import UtilizationTrace
from paged_bench.workloads import BenchRequest
from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.sched.request import Request
from paged_core.sched.scheduler import Scheduler

SIMULATED_TOKEN = 101


@dataclass(frozen=True)
class KVUtilConfig:
    """The shared budget and limits: ``kv_tokens`` slots (rounded down to whole blocks) for both allocators.

    ``layer_windows`` describes a sliding model, one entry per layer (``None``: full attention): the budget
    is then ``kv_tokens`` slots of every layer, the paged allocator runs the model's KV-cache groups (see
    :mod:`paged_core.memory.kv_groups`), and the same requests run again with full-attention accounting
    (every layer keeps every block, the window only a mask) on the same bytes.
    """

    kv_tokens: int = 32768
    block_size: int = 16
    max_len: int = 2048
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    layer_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        for name in ("kv_tokens", "block_size", "max_len", "max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"kv-util: {name} must be an int >= 1, got {value!r}")
        if self.num_blocks < 1:
            raise ValueError(f"kv-util: kv_tokens={self.kv_tokens} is less than one block of {self.block_size}")
        if self.max_len > self.num_slots and not self.layer_windows:
            raise ValueError(f"kv-util: max_len={self.max_len} exceeds the budget of {self.num_slots} slots")
        if any(w is not None and (not isinstance(w, int) or w < 1) for w in self.layer_windows):
            raise ValueError(f"kv-util: layer windows must be ints >= 1 or full, got {self.layer_windows!r}")

    @property
    def groups(self) -> KVCacheGroups | None:
        """The sliding model's KV-cache groups (``None`` without ``layer_windows``)."""
        return KVCacheGroups.from_windows(self.layer_windows) if self.layer_windows else None

    @property
    def num_blocks(self) -> int:
        """Usable blocks (the null block comes on top)."""
        return self.kv_tokens // self.block_size

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_tokens": self.num_slots,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_len": self.max_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "layer_windows": ["full" if w is None else w for w in self.layer_windows],
        }


def simulate_paged(
    requests: Sequence[BenchRequest],
    config: KVUtilConfig,
    progress: bool = False,
    groups: KVCacheGroups | None = None,
    name: str = "paged",
) -> UtilizationTrace:
    """Run ``requests`` (all arriving at once) through the real :class:`Scheduler`; one sample per step.

    With ``groups``, a block costs one group's layers: the budget of ``kv_tokens`` slots of every layer holds
    ``layers / layers-per-group`` times as many blocks, and slots are counted in full-model units.
    """
    num_blocks, share = config.num_blocks, 1.0
    if groups is not None:
        layers = len(groups.layer_group)
        num_blocks = config.num_blocks * layers // groups.num_tensors
        share = groups.num_tensors / layers
    sched = Scheduler(
        SchedulerConfig(
            max_model_len=config.max_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
        ),
        # Prompts are random ids, so prefix caching could not hit; off, it costs no hashing.
        CacheConfig(num_blocks=num_blocks + 1, block_size=config.block_size, enable_prefix_caching=False),
        kv_groups=groups,
    )
    for i, r in enumerate(requests):
        sched.add_request(Request(f"r{i}", r.prompt_token_ids, max_tokens=r.max_tokens, ignore_eos=True))
    pool, bs = sched.kv.pool, config.block_size
    trace = UtilizationTrace(name, config.num_slots)
    with tqdm(total=len(requests), desc=f"kv-util {name}", unit="req", disable=not progress) as bar:
        while sched.has_unfinished_requests():
            out = sched.schedule()
            if out.is_empty:
                raise RuntimeError("kv-util: the scheduler planned an empty step with requests left (stuck)")
            held = (pool.num_usable_blocks - pool.num_free_blocks) * bs * share
            trace.sample(int(held), int(_live_slots(sched.running, groups, bs) * share), len(sched.running))
            # Rows still mid-prompt ignore their token; the others append it.
            sampled = {rid: [SIMULATED_TOKEN] for rid in out.num_scheduled_tokens}
            updates = sched.update_from_output(out, sampled)
            bar.update(sum(1 for u in updates if u.finish_reason is not None))
    trace.preemptions = sched.num_preemptions
    return trace


def _live_slots(running: Sequence[Request], groups: KVCacheGroups | None, block_size: int) -> int:
    """Slots holding tokens a query can still read, summed over the groups (one group's worth each)."""
    if groups is None:
        return sum(req.num_computed_tokens for req in running)
    total = 0
    for req in running:
        n = req.num_computed_tokens
        for group in groups.groups:
            total += n - group.first_needed_block(n, block_size) * block_size
    return total


def run_kv_util(
    requests: Sequence[BenchRequest], config: KVUtilConfig, progress: bool = False
) -> tuple[UtilizationTrace, UtilizationTrace, dict[str, UtilizationTrace]]:
    """Both allocators on the same requests and budget: (paged, reserve-max-length, further paged runs).

    A sliding model (``layer_windows``) adds ``full-accounting``: the same scheduler with one full group.
    """
    groups = config.groups
    paged = simulate_paged(requests, config, progress, groups)
    reserved = simulate_reserved(
        requests, config.num_slots, config.max_len, config.max_num_batched_tokens, config.max_num_seqs
    )
    extra = {}
    if groups is not None:
        extra["full_accounting"] = simulate_paged(requests, config, progress, None, name="paged, full accounting")
    return paged, reserved, extra
