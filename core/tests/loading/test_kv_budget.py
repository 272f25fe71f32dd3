"""Parsing KV budgets and the default CPU budget."""

from __future__ import annotations

import pytest
import torch

from paged_core.api import default_device_hooks
from paged_core.errors import ConfigError
from paged_core.loading.kv_budget import CPU_DEFAULT_CAP, default_budget
from paged_core.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * 2**30),
        ("512MiB", 512 * 2**20),
        ("2GB", 2 * 10**9),
        ("1.5G", 1_500_000_000),
        (" 64 kib ", 65536),
        (1024, 1024),
        ("4096", 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "four GiB", "4 parsecs", "-1GiB", 0, -5, True, "0"])
def test_parse_size_refuses_with_the_field_named(bad: object) -> None:
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        parse_size(bad)  # type: ignore[arg-type]


def test_cpu_default_is_capped() -> None:
    assert 0 < default_budget(default_device_hooks(torch.device("cpu")), 0.9) <= CPU_DEFAULT_CAP
