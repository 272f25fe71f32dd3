"""``paged backends``: the rich table shows broken entries with their reasons, and the default choice."""

from __future__ import annotations

import sys

import pytest
import torch

import paged_core.cli.backends as backends_cli
from paged_core.api import BackendCapabilities, GraphSupport
from paged_core.cli.backends import capabilities_summary
from paged_core.cli.main import main
from paged_core.registry import BackendRegistry


@pytest.fixture(params=["rich", "plain"])
def renderer(request, monkeypatch) -> str:
    """Both renderings: rich's table, and the plain text a vendor's install without rich gets."""
    if request.param == "plain":
        monkeypatch.setitem(sys.modules, "rich.console", None)  # makes `from rich.console import ...` fail
    return str(request.param)


def test_table_shows_every_entry_and_reason(fake_registry, capsys, renderer) -> None:
    fake_registry()
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    for text in (
        "good",
        "loaded",
        "paged-backend-good 1.2 [good]",
        "dtypes bf16; heads any; blocks 16,32; graphs never",
        "npu",
        "unavailable",
        "no NPU driver",
        "raising",
        "load-error",
        "paged_register_backends() raised RuntimeError: kernel table [sm_90] missing",  # brackets are not markup
        "cli_fake_missing_module",
        "Selected by default: good",
        "plugin API v1",
    ):
        assert text in out, text
    assert "second line" not in out


def test_plain_table_is_aligned(fake_registry, capsys, monkeypatch) -> None:
    fake_registry()
    monkeypatch.setitem(sys.modules, "rich.console", None)
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("name"))
    good = next(line for line in lines if line.startswith("good "))
    assert good.index("loaded") == header.index("status") and good.index("v1") == header.index("api")


def test_table_when_nothing_is_usable(fake_registry, capsys, renderer) -> None:
    fake_registry(available=False)
    assert main(["backends"]) == 0  # broken plugins are information, not failure
    out = capsys.readouterr().out
    assert "No backend can be selected: no backend is available here" in out
    assert "no npu" in out


def test_table_with_an_unknown_paged_backend(fake_registry, capsys, monkeypatch) -> None:
    fake_registry()
    monkeypatch.setenv("PAGED_BACKEND", "cuda")
    assert main(["backends"]) == 0
    assert "unknown backend 'cuda'" in capsys.readouterr().out


def test_empty_registry(monkeypatch, capsys) -> None:
    monkeypatch.setattr(backends_cli, "load_registry", lambda: BackendRegistry([]))
    assert main(["backends"]) == 0
    assert "No backends found." in capsys.readouterr().out


def test_capabilities_summary() -> None:
    caps = BackendCapabilities(
        dtypes=frozenset({torch.float16, torch.float32}),
        block_sizes=(256, 512),
        head_sizes=frozenset({128, 64}),
        graph_support=GraphSupport.UNIFORM_DECODE,
    )
    assert capabilities_summary(caps) == "dtypes fp16,fp32; heads 64,128; blocks 256,512; graphs uniform_decode"
    assert capabilities_summary(None) == "-"
