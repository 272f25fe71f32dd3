"""Expert parallelism at the engine: a killed worker is reported as under tensor parallelism; refusals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.cli.engine_args import add_engine_args, engine_config_from
from paged_core.errors import UnsupportedConfigError

from .ep_helpers import save_tiny_moe
from .test_tp_faults import _step_until_failure, _streaming
from .tp_helpers import ENGINE, worker_pids

pytestmark = pytest.mark.serial  # two ranks, and bounds on how fast a lost rank is noticed

EP = {"tensor_parallel_size": 2, "enable_expert_parallel": True}


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_moe("mixtral", tmp_path_factory.mktemp("ep-engine"))


def test_a_worker_killed_mid_step_ends_the_engine_naming_it(tiny_mixtral: Path) -> None:
    llm = LLM(str(tiny_mixtral), **ENGINE, **EP)
    try:
        pid = _streaming(llm)
        os.kill(pid, signal.SIGKILL)
        exc, took = _step_until_failure(llm, 30.0)
        assert "worker rank 1" in str(exc) and "SIGKILL" in str(exc), exc
        assert took < 5.0, f"noticed after {took:.1f} s"
    finally:
        llm.close()
    assert worker_pids() == []


def test_uneven_experts_are_refused_before_any_rank_starts(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=3,
        num_experts_per_tok=2,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "three")
    start = time.monotonic()
    with pytest.raises(UnsupportedConfigError, match="2 ranks do not divide the model's 3 experts; sizes that work: 1"):
        LLM(str(tmp_path / "three"), **ENGINE, **EP)
    assert time.monotonic() - start < 5.0 and worker_pids() == []


def test_a_dense_model_is_refused(tiny_llama: Path) -> None:
    with pytest.raises(UnsupportedConfigError, match="has no routed experts"):
        LLM(str(tiny_llama), **ENGINE, **EP)
    assert worker_pids() == []


def test_the_transformers_path_is_refused_by_every_rank(tiny_mixtral: Path) -> None:
    with pytest.raises(UnsupportedConfigError, match="needs the fused decoder"):
        LLM(str(tiny_mixtral), model_impl="transformers", **ENGINE, **EP)
    assert worker_pids() == []


def test_the_flag_sits_beside_the_tensor_parallel_size() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--tensor-parallel-size", "2", "--enable-expert-parallel", "--model", "m"])
    assert engine_config_from(args).parallel.enable_expert_parallel is True
    assert engine_config_from(parser.parse_args(["--model", "m"])).parallel.enable_expert_parallel is False
