"""The automatic backend choice: the first available backend that accepts the model, and why others were passed."""

from __future__ import annotations

import logging

import pytest

from paged_core.api import AttentionSpec
from paged_core.engine_config import EngineConfig, ModelConfig
from paged_core.loading.build import choose_backend


def test_a_backend_that_cannot_serve_the_model_is_skipped_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Head size 72: the cpu backend (priority 50) refuses it, so the choice falls to one that accepts any head
    size, and the refusal with the supported set is logged at INFO (what ``-v`` shows)."""
    config = EngineConfig(model=ModelConfig(dtype="float32"))
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        cls, _, _, _ = choose_backend(config, [AttentionSpec(4, 2, 72)])
    assert cls.name != "cpu"
    skipped = [r.getMessage() for r in caplog.records if "cannot serve this model" in r.getMessage()]
    assert any(m.startswith("backend cpu:") and "head_size 72 not supported (supported: [64, 80" in m for m in skipped)


def test_an_accepted_model_logs_no_skip(caplog: pytest.LogCaptureFixture) -> None:
    config = EngineConfig(model=ModelConfig(dtype="float32"))
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        cls, _, _, _ = choose_backend(config, [AttentionSpec(4, 2, 64)])
    assert cls.name == "cpu"
    assert not [r for r in caplog.records if "cannot serve this model" in r.getMessage()]
