"""The installed distribution's metadata: it requires the torch minor the extension was compiled against."""

from __future__ import annotations

import importlib.metadata as md

import torch
from packaging.requirements import Requirement
from packaging.version import Version


def test_requires_the_torch_minor_it_was_built_against() -> None:
    (req,) = [Requirement(r) for r in md.requires("paged-backend-cpu") or [] if r.startswith("torch")]
    running = Version(torch.__version__.split("+")[0])
    assert running in req.specifier
    assert Version(f"{running.major}.{running.minor + 1}.0") not in req.specifier
    assert Version(f"{running.major}.{running.minor - 1}.99") not in req.specifier


def test_binary_is_stripped() -> None:
    import os
    from pathlib import Path

    import pytest

    import paged_backend_cpu._C as ext

    if os.environ.get("PAGED_BUILD_DEBUG") == "1":
        pytest.skip("PAGED_BUILD_DEBUG=1 keeps debug information on purpose")
    data = Path(ext.__file__).read_bytes()
    assert b".debug_info" not in data, "built with debug information; release builds pass -g0 and -s"
