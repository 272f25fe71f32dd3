"""Rank 0's side of tensor parallelism: form the group, start local workers, send plans, watch the ranks.

With ``distributed_init='local'`` rank 0 starts ranks 1..N-1 as child processes here (each one
``python -m paged_core.engine_core.tp_worker``, dying with its parent); with ``env`` they are launched
elsewhere by ``paged worker`` and rank 0 only meets them. Either way rank 0 hosts the rendezvous
store and puts its engine configuration there first, and every worker runs that configuration. A
worker that fails writes its cause into the store before exiting, so rank 0 reports it by name.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import time
from typing import Any

import msgspec
import torch

from paged_core.errors import ConfigError, DistributedError
from paged_core.parallel.group import (
    STARTUP_TIMEOUT,
    TPGroup,
    check_devices,
    collective_backend,
    join_group,
    local_ranks,
    threads_per_rank,
    wait_for_ranks,
)
from paged_core.parallel.heartbeat import Pulse, wait_for_byes
from paged_core.parallel.plans import PlanSender
from paged_core.parallel.rendezvous import CONFIG_KEY, DEVICE_KEY, Rendezvous, env_rendezvous, local_rendezvous
from paged_core.process.children import describe_exit, wait_or_kill
from paged_core.process.runtime import child_environ
from paged_core.sched.output import SchedulerOutput

log = logging.getLogger("paged.parallel")

BYE_WAIT = 2.0
"""Seconds rank 0's close waits for remote workers' byes (a live one answers the quit at once; a dead one never)."""
WORKER_MODULE = "paged_core.engine_core.tp_worker"
"""What a local worker rank runs (``python -m``); named, not imported: the worker sits above loading, this below."""


def error_key(rank: int) -> str:
    """Where a failing worker leaves its cause in the rendezvous store."""
    return f"paged/error/{rank}"


class Leader:
    """Rank 0: the group, the plan channel and (``local``) the worker processes."""

    def __init__(self, group: TPGroup, procs: dict[int, subprocess.Popen[bytes]], sender: PlanSender) -> None:
        self.group = group
        self.procs = procs
        remote = [r for r in range(1, group.world_size) if r not in procs]
        self.pulse = Pulse(group.store, remote, group.timeout)
        """Heartbeats of the ranks that are not our children (``env`` launches)."""
        self.sender = sender
        self._closed = False
        # An engine dropped without close(): leave the group in order before the interpreter takes the store down
        # under workers that are still beating into it.
        atexit.register(self.close)

    def send(self, out: SchedulerOutput) -> None:
        """Hand this step's plan to every worker (before rank 0 runs it: the forward's collectives need them)."""
        self.sender.send(out)

    def failure(self) -> str | None:
        """Why a worker is gone (local: its exit; remote: its heartbeat stopped), or ``None`` while all run."""
        return _first_death(self.procs, self.group.store) or self.pulse.silent()

    def barrier(self, name: str) -> None:
        """Wait for every rank to reach start-up phase ``name``, giving up at once if a local worker died."""
        # Not self.failure: workers beat only once serving, so heartbeats count from the first step on.
        self.group.barrier(name, STARTUP_TIMEOUT, lambda: _first_death(self.procs, self.group.store))

    def explain(self, exc: BaseException) -> str:
        """A step's exception as the cause the front end shows: a dead rank by name, a timed-out collective."""
        # A killed peer resets its connections as it dies: give its exit a moment to become visible.
        deadline = time.monotonic() + (1.0 if self.procs else 0.0)
        while (dead := self.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if dead is not None:
            return dead
        text = str(exc)
        first = text.splitlines()[0] if text else type(exc).__name__
        if "timed out" in text.lower() or "timeout" in text.lower():
            return (
                f"a tensor-parallel collective timed out after {self.group.timeout:.0f} s (distributed_timeout; "
                f"a rank is stalled or unreachable): {first}"
            )
        return f"tensor-parallel step failed: {type(exc).__name__}: {first}"

    def close(self, timeout: float = 5.0) -> None:
        """Tell workers to quit and wait for them, then leave the group (idempotent).

        The store goes with the group, so it goes last: local workers are waited for (then terminated
        and killed after ``timeout``), remote ones until they say bye (at most :data:`BYE_WAIT` s).
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self.sender.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                wait_or_kill(proc, timeout, "tensor-parallel worker")
        remote = [r for r in range(1, self.group.world_size) if r not in self.procs]
        if remote and (silent := wait_for_byes(self.group.store, remote, min(timeout, BYE_WAIT))):
            log.info("tensor-parallel worker ranks %s did not answer the quit; leaving the group", silent)
        self.group.destroy()


def _first_death(procs: dict[int, subprocess.Popen[bytes]], store: Any = None) -> str | None:
    """Why the first dead worker of ``procs`` is gone (its own cause from the store when it left one)."""
    for rank, proc in procs.items():
        code = proc.poll()
        if code is not None:
            cause = _cause(store, rank) if store is not None else None
            return f"tensor-parallel worker rank {rank} (pid {proc.pid}) died ({describe_exit(code)})" + (
                f": {cause}" if cause else ""
            )
    return None


def _cause(store: Any, rank: int) -> str | None:
    """The cause worker ``rank`` wrote before failing, if it got that far."""
    try:
        if store.check([error_key(rank)]):
            return str(store.get(error_key(rank)).decode())
    except Exception:  # best effort: we are already reporting a failure
        return None
    return None


def _start_local(rdv: Rendezvous, timeout: float) -> dict[int, subprocess.Popen[bytes]]:
    threads = threads_per_rank(rdv.world_size)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for rank in range(1, rdv.world_size):
        env = child_environ()
        env.update(
            MASTER_ADDR=rdv.addr,
            MASTER_PORT=str(rdv.port),
            WORLD_SIZE=str(rdv.world_size),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            PAGED_WORKER_PARENT=str(os.getpid()),
            PAGED_WORKER_THREADS=str(threads),
            OMP_NUM_THREADS=str(threads),
            PAGED_WORKER_TIMEOUT=str(timeout),
            PAGED_WORKER_VERBOSE="1" if log.isEnabledFor(logging.INFO) else "0",
        )
        procs[rank] = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.DEVNULL, env=env)
    return procs


def start_leader(config: Any, device: torch.device) -> Leader:
    """Rank 0 joins (and for ``local`` first starts) the tensor-parallel group; refuses what cannot run.

    Checks, before any process starts: collectives for ``device``, enough devices, the rendezvous
    variables for ``env`` (and that this launch is rank 0).
    """
    parallel = config.parallel
    tp = parallel.tensor_parallel_size
    collective_backend(device)
    check_devices(tp, device)
    local = parallel.distributed_init == "local"
    rdv = local_rendezvous(tp) if local else env_rendezvous(tp)
    if rdv.rank != 0:
        raise ConfigError(f"RANK={rdv.rank}: the engine core is rank 0; start ranks 1..{tp - 1} with `paged worker`")
    store = rdv.store(parallel.distributed_timeout)
    store.set(DEVICE_KEY, device.type)
    store.set(CONFIG_KEY, msgspec.json.encode(config))
    procs = _start_local(rdv, parallel.distributed_timeout) if local else {}
    torch.set_num_threads(threads_per_rank(tp if local else local_ranks()))
    try:
        # Every rank first checks in on the store (a worker's interpreter start is slow); only then does the
        # group form, under the collectives' own (short) timeout.
        wait_for_ranks(rdv.store(STARTUP_TIMEOUT), "paged/arrived", 0, tp, STARTUP_TIMEOUT, lambda: _first_death(procs))
        group = join_group(rdv, device, parallel.distributed_timeout)
        sender = PlanSender(group, rdv.addr, local=local)
    except BaseException as exc:
        for proc in procs.values():
            wait_or_kill(proc, 0.1, "tensor-parallel worker")
        if isinstance(exc, ConfigError):
            raise
        raise DistributedError(f"could not form the tensor-parallel group: {exc}") from None
    log.info("tensor parallel: %d ranks on %s (%s), rank 0 here", tp, device.type, group.backend)
    return Leader(group, procs, sender)
