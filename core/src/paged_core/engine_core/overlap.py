"""Asynchronous scheduling: the core plans step N+1 while step N's forward runs on a worker thread.

The synchronous loop runs schedule, forward, sample, update strictly in turn, so the device (or, on a
CPU, the cores running torch's kernels, which release the GIL) waits for the Python between forwards.
With asynchronous scheduling (``--async-scheduling``) the forward runs on one worker thread, and while
it runs the core:

1. schedules step N+1 with one *placeholder* token for every request step N samples for
   (:meth:`~paged_core.sched.scheduler.Scheduler.schedule` with ``overlap=True``);
2. waits for step N's logits and samples them on its own thread (the sampler, the grammar masks and
   each sequence's sampling state stay single-threaded);
3. fills step N's tokens into step N+1's plan (:func:`fill_placeholders`) and starts N+1's forward;
4. applies step N's tokens (the scheduler's update, stop rules, grammar matchers, deltas) and returns
   them, while step N+1 runs; the front end's work on those deltas overlaps it too.

Forwards run one at a time, in plan order, so a block freed while a step is in flight (a request that
ended, was aborted or preempted) is written by that step before any later step that reuses it runs. A
request found finished when step N is applied (EOS, a stop token, ``max_tokens``, a stop string, its
grammar's end) has a wasted row in step N+1: the token it samples there is dropped, as vLLM does.
Outputs are those of the synchronous loop: every request sees the same tokens in the same order, and
its sampling state (seeded streams, penalties, ``min_tokens``, grammar) advances exactly as there;
only the batches a request shares may differ (a finished request holds its row one step longer, a
waiting request may be admitted a step later), which changes no token under batch-invariant kernels.

What runs in turn instead, by name (:func:`overlap_blocker`):

- speculative decoding (drafts are proposed from the applied tokens): the whole engine;
- tensor parallelism (the plan goes to the workers before the forward): the whole engine;
- beam search (its beams are extended, forked and dropped after the update): every step while a beam
  request is in the core;
- ``n > 1`` before its siblings are forked (they are forked from the parent's sampled row, after the
  update): the step that runs the prompt's last chunk, and the one after it.

Structured outputs, chunked prefill, preemption (a request preempted by the plan in flight still gets
the token it was owed), prefix caching (a block is cached only once the step computing it has run) and
forked ``n > 1`` siblings all overlap.

Measured on a 2-core CPU (Intel Sapphire Rapids, other jobs sharing it), the embedded SmolLM2:
``paged bench serve --servers mp --compare-async`` with 64 ``throughput`` requests and 32 streams gave
157 against 199 output tok/s (0.79x) and ITL p50 109 against 83 ms (an earlier run on a busier machine:
1.32x tok/s, ITL 145 against 88 ms); with ``--serve-workload decode-1`` ITL p50 went from 8 ms to 29 ms
(3.4x worse, repeated four times). In process
(``LLM.generate``, alternated runs) 32 requests x 64 tokens gave 1.01x and ``decode-1`` 0.92x. What
was seen points at torch's GNU OpenMP rather than at the loop: with the serve configuration, a
``decode-1`` step took 8 ms on the main thread and 30 ms on a second thread, and once the second
thread had run one, 29 ms on the main thread too; ``OMP_WAIT_POLICY=active`` gave 19-23 ms. A second
thread running forwards gives the process a second OpenMP pool, more OpenMP threads than cores, and
(as libgomp does then) far less spin-waiting between a step's many short parallel regions. So the
default (``None``) is off on CPU; see :data:`DEFAULT_ON`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from paged_core.engine_core.rows import Rows
from paged_core.sched.output import SchedulerOutput

log = logging.getLogger("paged.engine")

DEFAULT_ON: frozenset[str] = frozenset()
"""Device kinds where ``async_scheduling=None`` means on: none. On a CPU it was measured not to pay (see above); on
an H200 (``ci/device_engine_check.py --only-async``, 2026-12-04) it did not either: decode tok/s 0.88x at batch 1
and 0.84x at batch 64 with device graphs, 0.78x and 1.06x eager
(``benchmarks/results/2026-12-04-h200-engine-device-cuda.json``); the replayed step is too short for the host's
scheduling to hide behind it, and the hand-off between threads costs more than it saves."""


@dataclass(slots=True)
class InFlight:
    """A step whose forward is running: its plan, its rows to come and the sampled sequences it runs, by id."""

    out: SchedulerOutput
    rows: Future[Rows]
    seqs: Mapping[str, object]
    """Each row's sequence as planned: a row whose id names another sequence by the time it is sampled (the
    request ended and a new one took its id) is dropped."""


class OverlapStats:
    """Steps finished with the next one already running (``overlapped``), and the others' reasons (``in_turn``)."""

    __slots__ = ("in_turn", "overlapped")

    def __init__(self) -> None:
        self.overlapped = 0
        self.in_turn: dict[str, int] = {}

    def count(self, blocker: str | None) -> None:
        """Count one step finished with asynchronous scheduling on: overlapped, or in turn for ``blocker``."""
        if blocker is None:
            self.overlapped += 1
        else:
            self.in_turn[blocker] = self.in_turn.get(blocker, 0) + 1


class StepWorker:
    """The one thread forwards run on, in the order they are submitted."""

    def __init__(self, execute: Callable[[SchedulerOutput], Rows]) -> None:
        self._execute = execute
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paged-step")

    def submit(self, out: SchedulerOutput) -> Future[Rows]:
        """Start ``out``'s forward after the ones already submitted."""
        return self._pool.submit(self._execute, out)

    def close(self) -> None:
        """Let the step in flight finish, then end the thread (idempotent)."""
        self._pool.shutdown(wait=True)


def async_scheduling(setting: bool | None, device_type: str, speculative: bool, tensor_parallel: bool) -> str | None:
    """Why the core runs in turn (``None``: it overlaps), given the configured switch and what the engine runs."""
    if setting is False:
        return "turned off (--no-async-scheduling)"
    if setting is None and device_type not in DEFAULT_ON:
        why = "measured not to pay there" if device_type == "cpu" else "not measured there yet"
        return f"off by default on {device_type} ({why}; --async-scheduling turns it on)"
    if speculative:
        return "speculative decoding proposes drafts from the applied tokens"
    if tensor_parallel:
        return "tensor parallelism sends each plan to the workers before its forward"
    return None


def overlap_blocker(out: SchedulerOutput, has_beams: bool, unforked: Callable[[str], bool]) -> str | None:
    """Why the step after ``out`` must wait for ``out`` to be applied (``None``: it may be planned now).

    ``unforked(seq_id)``: the sequence belongs to an ``n > 1`` request whose siblings are not forked yet.
    """
    if out.is_empty:
        return "nothing runs"
    if has_beams:
        return "beam search"
    if any(unforked(rid) for rid in out.num_scheduled_tokens):
        return "n > 1 forks"
    return None


def fill_placeholders(out: SchedulerOutput, token_ids: Mapping[str, Sequence[int]]) -> SchedulerOutput:
    """Append to ``out``'s rows the tokens the previous step sampled for its placeholders; ``out``, filled.

    A placeholder with no token (its request failed or ended in that step, and the row is dropped) is
    filled with token 0, so the forward still has an input there.
    """
    if not out.placeholder_req_ids:
        return out
    new = {data.req_id: data.token_ids for data in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    index = {rid: i for i, rid in enumerate(cached.req_ids)}
    for rid in out.placeholder_req_ids:
        toks = token_ids.get(rid)
        token = toks[0] if toks else 0
        if rid in index:
            cached.new_token_ids[index[rid]].append(token)
        else:
            new[rid].append(token)
    return out
