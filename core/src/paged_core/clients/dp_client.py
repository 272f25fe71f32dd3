"""DataParallelClient: M engine-core processes behind one server (``paged serve --data-parallel-size M``).

It is an :class:`~paged_core.clients.interface.AsyncCoreClient` over M :class:`EventLoopClient`\\ s, so
:class:`~paged_core.serve.async_engine.AsyncEngine` serves it like one core. The
:class:`~paged_core.clients.dp_router.Router` places each new request (prefix affinity, else the least-loaded
live core) and sends each abort to the core running its request. Each core's outputs go to the engine
as they come; :attr:`stats` is the cores' sum and :attr:`per_core` the figures of each, for ``/metrics``.

A core that dies fails only its own requests (:class:`EngineDeadError` "engine core 1 died: ...", through
``on_failed``), leaves routing, and is logged and reported in ``/health`` and ``paged_engine_up``; a
request that core had not yet answered for (no token, no refusal) is placed on another core instead, since
nothing of it reached the client. The other cores keep serving; ``on_dead`` fires only when the last one dies
(the server then exits non-zero).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from paged_core.clients.core_process import CoreProcess, EngineStartError
from paged_core.clients.dp_router import Router
from paged_core.clients.event_loop import EventLoopClient
from paged_core.clients.interface import AsyncCoreClient, OnDead, OnFailed, OnOutputs
from paged_core.engine_config import EngineConfig
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreFacts,
    CoreOutputs,
    CoreRequest,
    GrammarStats,
    SchedulerStats,
)
from paged_core.errors import EngineDeadError
from paged_core.parallel.placement import dp_environ

log = logging.getLogger("paged.serve")

__all__ = ["CoreStatus", "DataParallelClient", "start_core_processes", "sum_stats"]

_MUST_AGREE = ("model_name", "vocab_size", "eos_token_ids", "max_model_len", "block_size")


@dataclass(frozen=True)
class CoreStatus:
    """One data-parallel core as ``/health`` and ``/metrics`` report it."""

    index: int
    pid: int | None
    alive: bool
    stats: SchedulerStats
    """Its latest stats (a dead core's last ones)."""
    dead_reason: str | None = None
    routed: dict[str, int] = field(default_factory=dict)
    """Requests the router sent it, by reason (``affinity``, ``balance``)."""


def start_core_processes(
    config: EngineConfig, count: int, **process_options: Any
) -> tuple[list[CoreProcess], Any | None]:
    """Start ``count`` core processes, load the tokenizer meanwhile, then wait for every one (start-ups overlap).

    Each core gets ``config`` with ``data_parallel_size=1``: it is one engine and need not know of the others.
    If any fails to start, all are stopped and the first error is raised.
    """
    from paged_core.clients.factory import load_frontend_tokenizer
    from paged_core.loading.loader import resolve_source

    resolve_source(config.model.model)  # a bad path is refused before any process starts
    one = config.replace(data_parallel_size=1)
    processes: list[CoreProcess] = []
    try:
        for index in range(count):  # each core learns its slot: its devices and its share of the CPU threads
            processes.append(CoreProcess(one, environ=dp_environ(index, count), **process_options))
        tokenizer = load_frontend_tokenizer(config)
        for process in processes:
            process.wait_ready()
    except BaseException:
        _close_all(processes, 2.0)
        raise
    return processes, tokenizer


def sum_stats(live: list[SchedulerStats], every: list[SchedulerStats]) -> SchedulerStats:
    """Gauges (KV blocks, queues) summed over the ``live`` cores, counters over ``every`` core (so they never drop);
    batch-invariant when every core is."""
    usable = sum(s.num_usable_blocks for s in live)
    used = sum(s.kv_usage * s.num_usable_blocks for s in live)
    fallbacks: Counter[str] = Counter()
    for s in every:
        fallbacks.update(s.graph_fallbacks)
    return SchedulerStats(
        kv_usage=used / usable if usable else 0.0,
        num_free_blocks=sum(s.num_free_blocks for s in live),
        num_usable_blocks=usable,
        num_running=sum(s.num_running for s in live),
        num_waiting=sum(s.num_waiting for s in live),
        num_preemptions=sum(s.num_preemptions for s in every),
        prefix_queries=sum(s.prefix_queries for s in every),
        prefix_hits=sum(s.prefix_hits for s in every),
        steps=sum(s.steps for s in every),
        graph_mode=every[0].graph_mode if every else "eager",
        graph_replays=sum(s.graph_replays for s in every),
        graph_piece_replays=sum(s.graph_piece_replays for s in every),
        eager_steps=sum(s.eager_steps for s in every),
        graph_fallbacks=dict(fallbacks),
        spec_verify_rows=sum(s.spec_verify_rows for s in every),
        spec_draft_tokens=sum(s.spec_draft_tokens for s in every),
        spec_accepted_tokens=sum(s.spec_accepted_tokens for s in every),
        batch_invariant=bool(every) and all(s.batch_invariant for s in every),
        grammar=sum_grammar_stats([s.grammar for s in every]),
    )


def sum_grammar_stats(every: list[GrammarStats]) -> GrammarStats:
    """Structured outputs' counters and histogram buckets summed over cores."""
    seen = [g for g in every if g.requests]
    if not seen:
        return GrammarStats()
    return GrammarStats(
        requests=sum(g.requests for g in seen),
        compile_errors=sum(g.compile_errors for g in seen),
        compile_timeouts=sum(g.compile_timeouts for g in seen),
        compile_buckets=[sum(c) for c in zip(*(g.compile_buckets for g in seen), strict=True)],
        compile_seconds=sum(g.compile_seconds for g in seen),
        mask_buckets=[sum(c) for c in zip(*(g.mask_buckets for g in seen), strict=True)],
        mask_seconds=sum(g.mask_seconds for g in seen),
        mask_rows=sum(g.mask_rows for g in seen),
    )


class DataParallelClient(AsyncCoreClient):
    """Routes requests over several started core processes (see the module docstring).

    ``facts`` are the first core's, with the capacities (``max_num_seqs``, ``num_usable_blocks``) summed over
    the cores, since the server's admission bound covers all of them; the cores must agree on the model,
    vocabulary, EOS ids, context length and block size.
    """

    def __init__(self, clients: Sequence[AsyncCoreClient]) -> None:
        if not clients:
            raise ValueError("a data-parallel client needs at least one core")
        self.clients = list(clients)
        first = self.clients[0].facts
        for i, c in enumerate(self.clients[1:], 1):
            for name in _MUST_AGREE:
                if getattr(c.facts, name) != getattr(first, name):
                    raise EngineStartError(
                        f"engine cores 0 and {i} disagree on {name}: "
                        f"{getattr(first, name)!r} != {getattr(c.facts, name)!r}"
                    )
        self.facts: CoreFacts = msgspec.structs.replace(
            first,
            max_num_seqs=sum(c.facts.max_num_seqs for c in self.clients),
            num_usable_blocks=sum(c.facts.num_usable_blocks for c in self.clients),
        )
        self.router = Router(len(self.clients), first.block_size)
        self._core_stats = [c.stats for c in self.clients]
        for i, s in enumerate(self._core_stats):
            self.router.note_stats(i, s)
        self.stats: SchedulerStats = sum_stats(self._core_stats, self._core_stats)
        self._dead: dict[int, str] = {}
        self._unanswered: dict[str, CoreRequest] = {}
        """Requests sent to a core that has not yet answered for them (no delta, no refusal): re-placeable."""
        self._on_outputs: OnOutputs | None = None
        self._on_dead: OnDead | None = None
        self._on_failed: OnFailed | None = None

    @classmethod
    def launch(cls, config: EngineConfig, **process_options: Any) -> tuple[DataParallelClient, Any | None]:
        """Start ``config.parallel.data_parallel_size`` cores and the client over them; also the tokenizer."""
        processes, tokenizer = start_core_processes(config, config.parallel.data_parallel_size, **process_options)
        try:
            return cls([EventLoopClient(p) for p in processes]), tokenizer
        except BaseException:
            _close_all(processes, 2.0)
            raise

    # ---- AsyncCoreClient ------------------------------------------------
    def start(
        self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs, on_dead: OnDead, on_failed: OnFailed | None = None
    ) -> None:
        """Start every core's reader. Without ``on_failed`` the first core death is reported as ``on_dead``."""
        self._on_outputs, self._on_dead, self._on_failed = on_outputs, on_dead, on_failed
        for i, c in enumerate(self.clients):
            c.start(loop, functools.partial(self._outputs_from, i), functools.partial(self._core_died, i))

    @property
    def alive(self) -> bool:
        """True while at least one core serves."""
        return any(self._serves(i) for i in range(len(self.clients)))

    def _serves(self, core: int) -> bool:
        return core not in self._dead and bool(getattr(self.clients[core], "alive", True))

    @property
    def pids(self) -> list[int | None]:
        """Each core's process id (None for a core that is not a process)."""
        return [getattr(c, "pid", None) for c in self.clients]

    def add(self, requests: Sequence[CoreRequest]) -> dict[str, str]:
        """Place each request on a core and send it there (refusals come in that core's outputs)."""
        for request in requests:
            self._place(request)
        return {}

    def _place(self, request: CoreRequest, exclude: Iterable[int] = ()) -> None:
        tried = set(exclude)
        while True:
            route = self.router.route(
                request.request_id, request.prompt_token_ids, request.cache_salt, request.params.n, tried
            )
            try:
                self.clients[route.core].add([request])
            except EngineDeadError:  # the core died and its death is not yet reported: the next core
                self.router.forget(request.request_id)
                tried.add(route.core)
                continue
            self._unanswered[request.request_id] = request
            return

    def abort(self, abort: CoreAbort) -> None:
        for rid in abort.request_ids:
            self._unanswered.pop(rid, None)
        for core, part in self.router.split_abort(abort).items():
            self.clients[core].abort(part)

    async def call(self, method: str, *args: Any) -> Any:
        """Call every live core: boolean answers are combined with ``all`` (``reset_prefix_cache``), others listed."""
        live = [c for i, c in enumerate(self.clients) if i not in self._dead]
        if not live:
            raise EngineDeadError("every engine core is dead")
        results = await asyncio.gather(*(c.call(method, *args) for c in live))
        return all(results) if all(isinstance(r, bool) for r in results) else results

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every core at once (each gets ``timeout``), not one after another."""
        threads = [threading.Thread(target=c.shutdown, args=(timeout,), daemon=True) for c in self.clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 5.0)

    # ---- reports --------------------------------------------------------
    @property
    def per_core(self) -> list[CoreStatus]:
        """Every core's status and latest stats, by index."""
        return [
            CoreStatus(
                i, pid, self._serves(i), self._core_stats[i], self._dead.get(i), dict(self.router.cores[i].routed)
            )
            for i, pid in enumerate(self.pids)
        ]

    def core_health(self) -> list[dict[str, Any]]:
        """What ``/health`` lists: each core's index, pid, ``ok`` or ``dead`` and why."""
        out: list[dict[str, Any]] = []
        for s in self.per_core:
            entry: dict[str, Any] = {"engine": s.index, "pid": s.pid, "status": "ok" if s.alive else "dead"}
            if not s.alive:
                entry["reason"] = s.dead_reason or "the engine core is not running"
            out.append(entry)
        return out

    # ---- from the cores (event loop) ------------------------------------
    def _outputs_from(self, core: int, outputs: CoreOutputs) -> None:
        if core in self._dead:
            return
        self._core_stats[core] = outputs.stats
        self.router.note_stats(core, outputs.stats)
        for d in outputs.deltas:
            self._unanswered.pop(d.request_id, None)
            if d.finish_reason is not None or d.error is not None:
                self.router.sequence_done(d.request_id, d.index)
        for rid in [*outputs.failed, *outputs.refused]:
            self._unanswered.pop(rid, None)
            self.router.forget(rid)
        self._update_stats()
        assert self._on_outputs is not None
        self._on_outputs(outputs)

    def _core_died(self, core: int, why: str) -> None:
        if core in self._dead:
            return
        reason = f"engine core {core} died: {why}"
        self._dead[core] = reason
        lost = []
        for rid in self.router.mark_dead(core):
            request = self._unanswered.pop(rid, None)
            if request is not None and self._replace(request, core):
                continue
            lost.append(rid)
        left = len(self.clients) - len(self._dead)
        log.error("%s; %d request(s) on it failed, %d engine core(s) still serving", reason, len(lost), left)
        self._update_stats()
        if lost and self._on_failed is not None:
            self._on_failed(lost, EngineDeadError(reason))
        assert self._on_dead is not None
        if self._on_failed is None:  # the engine cannot fail single requests: a core's death is the engine's
            self._on_dead(reason)
        elif left == 0:
            self._on_dead("every engine core died: " + "; ".join(self._dead[i] for i in sorted(self._dead)))

    def _replace(self, request: CoreRequest, dead: int) -> bool:
        """Place a request its dead core never answered for on another core; False if none is left."""
        try:
            self._place(request, exclude=self._dead)
        except EngineDeadError:
            return False
        log.warning(
            "request %s: engine core %d died before answering; placed on another core", request.request_id, dead
        )
        return True

    def _update_stats(self) -> None:
        live = [s for i, s in enumerate(self._core_stats) if i not in self._dead]
        self.stats = sum_stats(live, self._core_stats)


def _close_all(processes: list[CoreProcess], timeout: float) -> None:
    threads = [threading.Thread(target=p.close, args=(timeout,), daemon=True) for p in processes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5.0)
