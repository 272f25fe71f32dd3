"""Rendezvous from torchrun's variables, refused with the reason; devices and collectives checked up front."""

from __future__ import annotations

import pytest
import torch

from paged_core.errors import ConfigError, UnsupportedConfigError
from paged_core.parallel.group import check_devices, collective_backend, threads_per_rank
from paged_core.parallel.rendezvous import env_rendezvous, free_port, local_rendezvous

GOOD = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1"}


def test_env_rendezvous_reads_torchrun_variables() -> None:
    rdv = env_rendezvous(2, GOOD)
    assert (rdv.addr, rdv.port, rdv.world_size, rdv.rank) == ("10.0.0.1", 29500, 2, 1)
    assert rdv.init_method == "tcp://10.0.0.1:29500"
    assert env_rendezvous(None, GOOD).world_size == 2  # a worker learns the size from the environment


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"MASTER_ADDR": ""}, "missing: MASTER_ADDR"),
        ({"RANK": "", "WORLD_SIZE": ""}, "missing: WORLD_SIZE, RANK"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT must be an integer"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port"),
        ({"WORLD_SIZE": "3"}, "WORLD_SIZE=3 but tensor_parallel_size=2"),
        ({"RANK": "2"}, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"),
    ],
)
def test_bad_or_missing_variables_are_refused_by_name(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        env_rendezvous(2, {**GOOD, **change})


def test_local_rendezvous_takes_a_free_loopback_port() -> None:
    a = local_rendezvous(2)
    assert a.addr == "127.0.0.1" and a.rank == 0 and a.world_size == 2 and 0 < a.port < 65536
    assert free_port() != 0


def test_more_ranks_than_devices_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices; the refusal is checked where it has none")  # not counted as a pass
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 needs 2 cuda devices; 0 available"):
        check_devices(2, torch.device("cuda"))
    check_devices(64, torch.device("cpu"))  # CPU ranks share the host's cores


def test_a_device_without_collectives_is_refused() -> None:
    assert collective_backend(torch.device("cpu")) == "gloo"
    with pytest.raises(UnsupportedConfigError, match="no collectives known"):
        collective_backend(torch.device("meta"))


def test_threads_are_split_between_local_ranks() -> None:
    assert threads_per_rank(1) >= threads_per_rank(2) >= 1
    assert threads_per_rank(10_000) == 1
