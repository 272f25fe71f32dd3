"""Where tensor-parallel ranks meet: a free loopback port (``local``) or torchrun's variables (``env``)."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from paged_core.errors import ConfigError

ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
"""The variables ``distributed_init='env'`` reads (the ones ``torchrun`` sets)."""


CONFIG_KEY = "paged/config"
"""Where rank 0 leaves its engine configuration, so every worker runs exactly the same one."""
DEVICE_KEY = "paged/device"
"""Where rank 0 leaves the device type it runs on (the collectives every rank joins with)."""


@dataclass
class Rendezvous:
    """One rank's place in the group: rank 0's address and port, the group size and this rank.

    The ranks meet in a ``torch.distributed`` TCP store that rank 0 hosts on that port: rank 0
    publishes its engine configuration there before the group forms, and workers read it (so a
    worker needs no flags of its own and cannot disagree with rank 0).
    """

    addr: str
    port: int
    world_size: int
    rank: int
    _store: Any = field(default=None, repr=False, compare=False)

    def store(self, timeout: float) -> Any:
        """The rendezvous store (hosted by rank 0; a worker waits up to ``timeout`` for it to come up)."""
        if self._store is None:
            from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs

            try:
                self._store = TCPStore(
                    self.addr,
                    self.port,
                    self.world_size,
                    self.rank == 0,
                    datetime.timedelta(seconds=timeout),
                    wait_for_workers=False,
                )
            except (RuntimeError, ValueError, OSError) as exc:
                role = "host" if self.rank == 0 else "reach"
                why = str(exc).splitlines()[0] if str(exc) else repr(exc)
                raise ConfigError(
                    f"rank {self.rank}: cannot {role} the rendezvous store at {self.addr}:{self.port} "
                    f"within {timeout:.0f} s ({why})"
                ) from None
        return self._store

    @property
    def init_method(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"tcp://{host}:{self.port}"


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it; never a fixed number two instances could share)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def local_rendezvous(world_size: int) -> Rendezvous:
    """Rank 0 of a group whose ranks all run on this machine, meeting on a free loopback port."""
    return Rendezvous("127.0.0.1", free_port(), world_size, 0)


def env_rendezvous(world_size: int | None, environ: Mapping[str, str] | None = None) -> Rendezvous:
    """This launch's rank from ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``; refuses a missing or bad one.

    ``world_size`` is the tensor-parallel size ``WORLD_SIZE`` must equal (``None``: a worker, which
    learns the size from rank 0).
    """
    env = os.environ if environ is None else environ
    missing = [v for v in ENV_VARS if not env.get(v)]
    if missing:
        raise ConfigError(
            f"distributed_init='env' needs {', '.join(ENV_VARS)} in the environment; missing: {', '.join(missing)} "
            "(set them as torchrun does, or use distributed_init='local' to start every rank on this machine)"
        )
    values = {}
    for name in ("MASTER_PORT", "WORLD_SIZE", "RANK"):
        try:
            values[name] = int(env[name])
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {env[name]!r}") from None
    port, world, rank = values["MASTER_PORT"], values["WORLD_SIZE"], values["RANK"]
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT must be a TCP port in [1, 65535], got {port}")
    if world < 1:
        raise ConfigError(f"WORLD_SIZE must be >= 1, got {world}")
    if world_size is not None and world != world_size:
        raise ConfigError(f"WORLD_SIZE={world} but tensor_parallel_size={world_size}; they must be equal")
    if not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    return Rendezvous(env["MASTER_ADDR"], port, world, rank)
