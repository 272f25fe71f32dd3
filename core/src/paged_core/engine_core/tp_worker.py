"""A tensor-parallel worker (ranks 1..N-1): ``python -m paged_core.engine_core.tp_worker`` or ``paged worker``.

It reads rank 0's engine configuration from the rendezvous store, joins the group, loads and shards
the model, builds its model runner exactly as rank 0 does (the KV block count agreed, warm-up in
lockstep), then runs every step plan rank 0 sends and drops the logits: a pure function of the plan
stream; only rank 0 samples. It exits on rank 0's quit, when rank 0 is gone (its parent died, or
the rendezvous store stopped answering), and on its own failure, after writing the cause into the
store for rank 0 to report.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

log = logging.getLogger("paged.parallel")


def _rank0_gone(group: Any, parent: int | None) -> bool:
    if parent is not None:
        return os.getppid() != parent
    try:
        group.store.check(["paged/plans/1"])  # any call: it fails once rank 0 (the store's host) is gone
        return False
    except Exception:
        return True


def run_worker(config: Any, rendezvous: Any, parent: int | None = None) -> int:
    """Serve as rank ``rendezvous.rank`` until rank 0 quits or goes away; the exit status."""
    import torch

    from paged_core.loading.build import build_parts, load
    from paged_core.parallel.group import STARTUP_TIMEOUT, join_group, local_ranks, threads_per_rank, wait_for_ranks
    from paged_core.parallel.heartbeat import BEAT_INTERVAL, Heart, say_bye
    from paged_core.parallel.plans import PlanReceiver
    from paged_core.parallel.rendezvous import DEVICE_KEY

    threads = os.environ.get("PAGED_WORKER_THREADS")  # set by a local rank 0; else torchrun's LOCAL_WORLD_SIZE
    torch.set_num_threads(int(threads) if threads else threads_per_rank(local_ranks()))
    try:
        store = rendezvous.store(STARTUP_TIMEOUT)
        device = torch.device(store.get(DEVICE_KEY).decode())
        wait_for_ranks(store, "paged/arrived", rendezvous.rank, rendezvous.world_size, STARTUP_TIMEOUT)
        group = join_group(rendezvous, device, config.parallel.distributed_timeout)
        loaded = load(config, group)
        parts = build_parts(config, loaded)
        plans = PlanReceiver(group)
    except BaseException as exc:
        _report(rendezvous, f"start-up failed: {type(exc).__name__}: {exc}")
        log.exception("tensor-parallel worker rank %d: start-up failed", rendezvous.rank)
        return 1
    log.info("tensor-parallel worker rank %d ready", group.rank)
    runner = parts.runner
    heart = Heart(group.store, group.rank)
    try:
        while True:
            if not heart.beat():
                log.warning("rank %d: rank 0's store is gone; exiting", group.rank)
                return 0
            plan = plans.recv(int(BEAT_INTERVAL * 1000))
            if plan is None:  # rank 0's quit: the heart has stopped; the bye is this rank's last store write
                say_bye(group.store, group.rank)
                return 0
            if plan is False:
                if _rank0_gone(group, parent):
                    log.warning("rank %d: rank 0 is gone; exiting", group.rank)
                    return 0
                continue
            assert not isinstance(plan, bool)
            runner.execute(plan)
    except BaseException as exc:
        _report(rendezvous, f"{type(exc).__name__}: {exc}")
        log.exception("tensor-parallel worker rank %d failed", group.rank)
        return 1
    finally:
        plans.close()
        group.destroy()


def _report(rendezvous: Any, cause: str) -> None:
    """Leave ``cause`` in the rendezvous store for rank 0 to name (best effort: it also sees this process exit)."""
    from paged_core.parallel.leader import error_key

    try:
        rendezvous.store(5.0).set(error_key(rendezvous.rank), (cause.splitlines() or [""])[0][:500])
    except Exception:
        pass


def fetch_config(rendezvous: Any, timeout: float) -> Any:
    """Rank 0's :class:`EngineConfig`, from the rendezvous store (waits up to ``timeout`` for rank 0)."""
    import msgspec

    from paged_core.engine_config import EngineConfig
    from paged_core.errors import ConfigError
    from paged_core.parallel.rendezvous import CONFIG_KEY

    store = rendezvous.store(timeout)
    try:
        raw = store.get(CONFIG_KEY)
    except Exception as exc:
        raise ConfigError(
            f"rank {rendezvous.rank}: rank 0 published no engine configuration at "
            f"{rendezvous.addr}:{rendezvous.port} within {timeout:.0f} s ({exc})"
        ) from None
    config = msgspec.json.decode(raw, type=EngineConfig)
    if config.parallel.tensor_parallel_size != rendezvous.world_size:
        raise ConfigError(
            f"WORLD_SIZE={rendezvous.world_size} but rank 0 runs tensor_parallel_size="
            f"{config.parallel.tensor_parallel_size}"
        )
    return config


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker rank 0 started on this machine (``local``): the rank comes from the environment."""
    from paged_core.parallel.rendezvous import env_rendezvous
    from paged_core.process.logs import setup_logging
    from paged_core.process.parent import die_with_parent
    from paged_core.process.runtime import adopt

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; rank 0 drives the shutdown
    adopt()
    setup_logging(os.environ.get("PAGED_WORKER_VERBOSE") == "1")
    rdv = env_rendezvous(None)
    config = fetch_config(rdv, float(os.environ.get("PAGED_WORKER_TIMEOUT", "60")))
    parent = int(os.environ.get("PAGED_WORKER_PARENT", "0")) or None
    return run_worker(config, rdv, parent)


if __name__ == "__main__":
    sys.exit(main())
