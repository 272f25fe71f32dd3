"""Data-parallel cores on one machine: each takes its own accelerators and its share of the CPU threads."""

from __future__ import annotations

import pytest
import torch

from paged_core.errors import ConfigError
from paged_core.parallel.group import check_devices, threads_per_rank
from paged_core.parallel.placement import dp_environ, dp_slot, place


def test_alone_a_core_takes_device_0_and_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PAGED_DP_RANK", "PAGED_DP_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert dp_slot() == (0, 1)
    assert place(torch.device("cuda"), 0, 1) == torch.device("cuda", 0)
    assert place(torch.device("cpu"), 1, 2) == torch.device("cpu")


def test_core_i_takes_devices_i_times_tp_onwards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for name, value in dp_environ(1, 2).items():
        monkeypatch.setenv(name, value)
    assert dp_slot() == (1, 2)
    assert [place(torch.device("cuda"), r, 2) for r in range(2)] == [torch.device("cuda", 2), torch.device("cuda", 3)]
    assert place(torch.device("xpu"), 0, 1) == torch.device("xpu", 1)


def test_threads_are_shared_by_every_rank_of_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGED_DP_SIZE", raising=False)
    alone = threads_per_rank(1)
    monkeypatch.setenv("PAGED_DP_SIZE", "2")
    monkeypatch.setenv("PAGED_DP_RANK", "0")
    assert threads_per_rank(1) == max(1, alone // 2)


def test_devices_are_counted_for_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices; the refusal is checked where it has none")
    for name, value in dp_environ(0, 2).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="needs 2 per engine core x 2 cores cuda devices; 0 available"):
        check_devices(2, torch.device("cuda"))
