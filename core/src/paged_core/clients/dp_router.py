"""Router: which of M engine cores (data parallel) gets each new request, and where its aborts go.

Placement has two rules, applied in order:

1. **Prefix affinity.** A request whose prompt continues a prefix this router recently placed goes to the
   core that holds that prefix, because only there can the prefix cache skip its prefill. Prefixes are
   remembered as chain keys over full KV blocks (the unit the core's prefix cache stores): key 1 is
   ``hash(cache_salt, block 1)``, key k is ``hash(key k-1, block k)``, for the first
   :data:`MAX_AFFINITY_BLOCKS` blocks, each mapped to the core it was last sent to (a bounded LRU). The
   deepest remembered key is the match; it counts only when it covers at least
   :data:`MIN_AFFINITY_FRACTION` of the prompt's keyed blocks, so a short common opening (a chat
   template's first block, the same for every user) does not pull all traffic onto one core. The
   ``cache_salt`` is in key 1, so tenants who salt their caches never share a placement either.
2. **Balance** otherwise: the live core with the shortest queue, then the most free KV blocks (from its
   last stats), then the lowest index. A core's queue is the larger of running + waiting in its last stats
   and the sequences this router placed on it that have not ended: the front end is the cores' only
   client, so its own count is exact and current, while stats lag (a step that began before an add
   reports without it, so a burst of adds would all see the same stale queue).

Affinity yields to balance when its core is dead, or is "much more loaded" than the best one: its queue
exceeds the best queue by more than ``max(AFFINITY_SLACK, AFFINITY_RATIO * best queue)`` sequences, or
it has no free KV block while the best one has some (the request would preempt another). Waiting
behind a few more sequences costs less than recomputing a long prefix, but an affinity that keeps
feeding one core while the other idles costs more; the request's blocks are then remembered on the new
core, so a hot prefix spreads to a second core instead of queueing on one.

A request (all of its ``n`` samples) stays on one core; the router remembers ``request_id -> core`` until
every sample ended, so :meth:`split_abort` sends each abort to the core that runs the request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from paged_core.engine_core.messages import CoreAbort, SchedulerStats
from paged_core.errors import EngineDeadError

__all__ = [
    "AFFINITY_ENTRIES",
    "AFFINITY_RATIO",
    "AFFINITY_SLACK",
    "MAX_AFFINITY_BLOCKS",
    "MIN_AFFINITY_FRACTION",
    "Route",
    "Router",
    "prefix_keys",
]

MAX_AFFINITY_BLOCKS = 64
"""Full blocks of a prompt that are keyed (1,024 tokens at block size 16): bounds hashing and memory per request."""
MIN_AFFINITY_FRACTION = 0.5
"""The matched prefix must cover this share of the prompt's keyed blocks for affinity to apply."""
AFFINITY_SLACK = 8
"""Sequences an affinity core may be ahead of the least-loaded core and still get the request..."""
AFFINITY_RATIO = 0.5
"""...or this fraction of the least-loaded core's queue, whichever is larger."""
AFFINITY_ENTRIES = 1 << 16
"""Prefix keys remembered (least recently used dropped first)."""


def prefix_keys(
    prompt: Sequence[int], block_size: int, cache_salt: str | None, limit: int = MAX_AFFINITY_BLOCKS
) -> list[int]:
    """Chain keys of the prompt's first ``limit`` full blocks (key k depends on the salt and blocks 1..k)."""
    keys: list[int] = []
    key = hash(("paged-dp", cache_salt))
    for start in range(0, min(len(prompt) // block_size, limit) * block_size, block_size):
        key = hash((key, tuple(prompt[start : start + block_size])))
        keys.append(key)
    return keys


@dataclass
class _Core:
    queue: int = 0
    """Running + waiting sequences in the core's last stats."""
    free_blocks: int = 0
    placed: int = 0
    """Sequences this router placed here that have not ended."""
    alive: bool = True
    routed: dict[str, int] = field(default_factory=lambda: {"affinity": 0, "balance": 0})

    @property
    def load(self) -> int:
        return max(self.queue, self.placed)


@dataclass(frozen=True)
class Route:
    """Where a request went and why: ``affinity`` (a remembered prefix) or ``balance`` (least loaded)."""

    core: int
    reason: str
    matched_blocks: int = 0


class Router:
    """Places requests on ``num_cores`` cores (see the module docstring); pure bookkeeping, no I/O."""

    def __init__(self, num_cores: int, block_size: int, *, affinity_entries: int = AFFINITY_ENTRIES) -> None:
        if num_cores < 1 or block_size < 1:
            raise ValueError("a router needs at least one core and a positive block size")
        self.block_size = block_size
        self.cores = [_Core() for _ in range(num_cores)]
        self._prefixes: OrderedDict[int, int] = OrderedDict()
        self._capacity = affinity_entries
        self._placed: dict[str, tuple[int, set[int]]] = {}
        """request_id -> (core, indices of its samples still running)."""

    # ---- placement ------------------------------------------------------
    def route(
        self,
        request_id: str,
        prompt: Sequence[int],
        cache_salt: str | None = None,
        n: int = 1,
        exclude: Iterable[int] = (),
    ) -> Route:
        """Pick a core for a new request and remember it; :class:`EngineDeadError` if no live core is left."""
        if request_id in self._placed:
            raise ValueError(f"request id {request_id!r} is already placed on core {self._placed[request_id][0]}")
        skip = set(exclude)
        live = [i for i, c in enumerate(self.cores) if c.alive and i not in skip]
        if not live:
            raise EngineDeadError("every engine core is dead")
        best = min(live, key=lambda i: (self.cores[i].load, -self.cores[i].free_blocks, i))
        keys = prefix_keys(prompt, self.block_size, cache_salt)
        route = Route(best, "balance")
        match = self._match(keys, skip)
        if match is not None and self._keeps_affinity(match[0], best):
            route = Route(match[0], "affinity", match[1])
        core = self.cores[route.core]
        core.placed += n
        core.routed[route.reason] += 1
        self._remember(keys, route.core)
        self._placed[request_id] = (route.core, set(range(n)))
        return route

    def _match(self, keys: list[int], skip: set[int]) -> tuple[int, int] | None:
        """(core, matched blocks) of the deepest remembered key on a live core, if deep enough to count."""
        for depth in range(len(keys), 0, -1):
            core = self._prefixes.get(keys[depth - 1])
            if core is None or not self.cores[core].alive or core in skip:
                continue
            return (core, depth) if depth >= MIN_AFFINITY_FRACTION * len(keys) else None
        return None

    def _keeps_affinity(self, core: int, best: int) -> bool:
        a, b = self.cores[core], self.cores[best]
        if a.load - b.load > max(AFFINITY_SLACK, AFFINITY_RATIO * b.load):
            return False
        return not (a.free_blocks == 0 and b.free_blocks > 0)

    def _remember(self, keys: list[int], core: int) -> None:
        for key in keys:
            self._prefixes[key] = core
            self._prefixes.move_to_end(key)
        while len(self._prefixes) > self._capacity:
            self._prefixes.popitem(last=False)

    # ---- what the cores report ------------------------------------------
    def note_stats(self, core: int, stats: SchedulerStats) -> None:
        """A core's stats after a step: its queue and free blocks now include what was routed before."""
        c = self.cores[core]
        c.queue = stats.num_running + stats.num_waiting
        c.free_blocks = stats.num_free_blocks

    def mark_dead(self, core: int) -> list[str]:
        """Take a core out of routing; the ids of the requests it was running (now forgotten)."""
        self.cores[core].alive = False
        lost = [rid for rid, (c, _) in self._placed.items() if c == core]
        for rid in lost:
            self._drop(rid)
        return lost

    def sequence_done(self, request_id: str, index: int) -> None:
        """One sample of a request ended (finished, failed or stopped); the request is forgotten after its last."""
        placed = self._placed.get(request_id)
        if placed is not None and index in placed[1]:
            placed[1].discard(index)
            self.cores[placed[0]].placed -= 1
            if not placed[1]:
                del self._placed[request_id]

    def forget(self, request_id: str) -> None:
        """The request is over (refused, failed, aborted): nothing more goes to its core."""
        self._drop(request_id)

    def _drop(self, request_id: str) -> tuple[int, set[int]] | None:
        placed = self._placed.pop(request_id, None)
        if placed is not None:
            self.cores[placed[0]].placed -= len(placed[1])
        return placed

    # ---- lookups --------------------------------------------------------
    def core_of(self, request_id: str) -> int | None:
        """The core running the request, or None once it is over (or was never placed)."""
        placed = self._placed.get(request_id)
        return None if placed is None else placed[0]

    @property
    def num_placed(self) -> int:
        return len(self._placed)

    def split_abort(self, abort: CoreAbort) -> dict[int, CoreAbort]:
        """The abort for each core that runs one of its requests; ids that are over are dropped."""
        ids: dict[int, list[str]] = {}
        seqs: dict[int, list[tuple[str, int]]] = {}
        for rid in abort.request_ids:
            placed = self._drop(rid)
            if placed is not None:
                ids.setdefault(placed[0], []).append(rid)
        for rid, index in abort.sequences:
            core = self.core_of(rid)
            if core is not None:
                seqs.setdefault(core, []).append((rid, index))
                self.sequence_done(rid, index)
        return {
            core: CoreAbort(request_ids=ids.get(core, []), sequences=seqs.get(core, []), stopped=abort.stopped)
            for core in sorted(ids.keys() | seqs.keys())
        }
