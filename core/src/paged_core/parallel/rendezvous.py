"""Where tensor-parallel ranks meet: a free loopback port (``local``) or torchrun's variables (``env``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from paged_core.errors import ConfigError

ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
"""The variables ``distributed_init='env'`` reads (the ones ``torchrun`` sets)."""


@dataclass(frozen=True)
class Rendezvous:
    """One rank's place in the group: rank 0's address and port, the group size and this rank."""

    addr: str
    port: int
    world_size: int
    rank: int

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


def env_rendezvous(world_size: int, environ: Mapping[str, str] | None = None) -> Rendezvous:
    """This launch's rank from ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``; refuses a missing or bad one."""
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
    if world != world_size:
        raise ConfigError(f"WORLD_SIZE={world} but tensor_parallel_size={world_size}; they must be equal")
    if not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    return Rendezvous(env["MASTER_ADDR"], port, world, rank)
