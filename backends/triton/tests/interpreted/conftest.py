"""Fixtures of the interpreted kernel checks (loaded by the child run of ``test_interpreted.py``)."""

from __future__ import annotations

import pytest

from paged_triton.tiles import INTERPRET_TILES_ENV


@pytest.fixture(params=["cdna", "xpu"])
def family(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with this family's device tiles (AMD/NVIDIA-style, Intel) instead of the interpreter's own."""
    monkeypatch.setenv(INTERPRET_TILES_ENV, request.param)
    return str(request.param)
