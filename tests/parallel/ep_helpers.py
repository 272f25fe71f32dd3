"""The e2e battery's tiny random MoE models (tests/e2e/tiny_models.py), for expert-parallel tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

TINY_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "tiny_models.py"


def _tiny_models() -> Any:
    spec = importlib.util.spec_from_file_location("paged_tiny_models", TINY_MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_tiny_moe(arch: str, directory: Path) -> Path:
    """``qwen3_moe`` (8 experts, top-2, a dense middle layer) or ``mixtral`` (4 experts, top-2), seeded."""
    path: Path = _tiny_models().save_tiny_model(arch, directory)
    return path


MOE_ARCHS = ("qwen3_moe", "mixtral")
