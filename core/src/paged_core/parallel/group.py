"""The tensor-parallel process group: set up with a short timeout, and the collectives the model path calls."""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paged_core.errors import ConfigError, DistributedError, UnsupportedConfigError
from paged_core.parallel.rendezvous import Rendezvous

log = logging.getLogger("paged.parallel")

COLLECTIVES = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl"}
"""The ``torch.distributed`` backend each device type runs its collectives on."""


def collective_backend(device: torch.device) -> str:
    """The collectives for ``device``; refuses a device type without one, or one this torch build lacks."""
    import torch.distributed as dist

    name = COLLECTIVES.get(device.type)
    if name is None:
        raise UnsupportedConfigError(
            f"tensor parallelism on {device.type} devices: no collectives known (supported: "
            + ", ".join(f"{d} ({b})" for d, b in COLLECTIVES.items())
            + ")"
        )
    if not dist.is_available() or not dist.is_backend_available(name):
        raise UnsupportedConfigError(
            f"tensor parallelism on {device.type} needs torch.distributed's {name!r} "
            "backend, which this torch build does not have"
        )
    return name


def check_devices(tp: int, device: torch.device) -> None:
    """Refuse more ranks than devices (accelerators); a CPU host runs any number of ranks, sharing its cores."""
    from paged_core.parallel.placement import dp_slot

    if device.type == "cpu":
        return
    module = getattr(torch, device.type, None)
    count = int(module.device_count()) if module is not None and hasattr(module, "device_count") else 0
    cores = dp_slot()[1]
    if cores * tp > count:
        need = f"{tp} per engine core x {cores} cores" if cores > 1 else str(tp)
        raise ConfigError(f"tensor_parallel_size={tp} needs {need} {device.type} devices; {count} available")


def local_ranks(default: int = 1) -> int:
    """How many ranks share this machine: torchrun's ``LOCAL_WORLD_SIZE`` when set, else ``default``."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", default)))
    except ValueError:
        return default


def threads_per_rank(ranks_here: int) -> int:
    """Intra-op threads for one of ``ranks_here`` ranks of this core, so ranks (and data-parallel cores) share."""
    from paged_core.parallel.placement import dp_slot

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // (max(1, ranks_here) * dp_slot()[1]))


@dataclass
class TPGroup:
    """This process's rank in a tensor-parallel group (the default ``torch.distributed`` group)."""

    rank: int
    world_size: int
    backend: str
    timeout: float
    device: torch.device
    """Where collective buffers live (NCCL reduces device tensors, gloo host ones)."""
    store: Any
    """The rendezvous key-value store (rank 0 publishes where workers receive plans; workers leave failures)."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place (the row-parallel projections' partial sums)."""
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return tensor

    def min_int(self, value: int) -> int:
        """The smallest ``value`` any rank holds (the KV block count every rank can afford)."""
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.device if self.backend != "gloo" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def barrier(self, name: str, timeout: float, watch: Callable[[], str | None] | None = None) -> None:
        """Wait until every rank reached ``name``, up to ``timeout`` (start-up phases; collectives keep theirs).

        Runs on the rendezvous store, not a collective, so a slow phase (loading weights) gets its own
        allowance; ``watch`` is asked every second why to give up early (a worker that died).
        """
        wait_for_ranks(self.store, f"paged/{name}", self.rank, self.world_size, timeout, watch)

    def destroy(self) -> None:
        """Leave the group (idempotent), so a later engine in this process can form a new one."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


STARTUP_TIMEOUT = 600.0
"""Seconds a rank may take to start and to load its weights before the others give up on it."""


def wait_for_ranks(
    store: Any, prefix: str, rank: int, world: int, timeout: float, watch: Callable[[], str | None] | None = None
) -> None:
    """Mark ``rank`` as arrived at ``prefix`` and wait for all ``world`` ranks, checking ``watch`` as it polls."""
    import time

    store.set(f"{prefix}/{rank}", b"1")
    keys = [f"{prefix}/{r}" for r in range(world)]
    deadline = time.monotonic() + timeout
    while True:
        # Polled with check() (the store's own wait() logs a warning each time it times out).
        if store.check(keys):
            return
        time.sleep(0.1)
        why = watch() if watch is not None else None
        if why is not None:
            raise DistributedError(why)
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([f"{prefix}/{r}"])]
            raise DistributedError(
                f"ranks {missing} did not reach {prefix.removeprefix('paged/')!r} within {timeout:.0f} s"
            )


def join_group(rdv: Rendezvous, device: torch.device, timeout: float) -> TPGroup:
    """Join the group described by ``rdv``; blocks until every rank has joined or ``timeout`` seconds pass."""
    import torch.distributed as dist

    backend = collective_backend(device)
    if dist.is_initialized():
        raise ConfigError(
            "this process already belongs to a torch.distributed group (another tensor-parallel "
            "engine is running here); close it first"
        )
    log.info("rank %d/%d joining the %s group at %s", rdv.rank, rdv.world_size, backend, rdv.init_method)
    try:
        dist.init_process_group(
            backend,
            store=rdv.store(timeout),
            rank=rdv.rank,
            world_size=rdv.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise ConfigError(
            f"rank {rdv.rank}: could not join the tensor-parallel group at {rdv.init_method} "
            f"within {timeout:.0f} s ({exc})"
        ) from None
    return TPGroup(rdv.rank, rdv.world_size, backend, timeout, device, rdv.store(timeout))
