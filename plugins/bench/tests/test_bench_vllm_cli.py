"""``paged bench --baseline vllm`` through the CLI, with a stand-in for vLLM's environment (vLLM is not installed).

The stand-in environment's ``bin/python`` is a shell script that runs a fake
driver with this interpreter: it answers the real driver's protocol, so the
whole path (options, dispatch, subprocess, report, table) runs here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from paged_bench.schema import validate_report
from paged_core.cli.main import main

FAKE_DRIVER = """
import json, sys
spec = json.load(open(sys.argv[1]))
reqs = spec["requests"]
tokens = [r["max_tokens"] for r in reqs]
json.dump({"seconds": 4.0, "num_requests": len(reqs), "per_request_output_tokens": tokens,
           "ttft": [0.5] * len(reqs), "decode_tok_s": 3.0, "steps": 9, "cached_prompt_tokens": 0,
           "startup_s": 20.0, "eager": spec["engine"]["enforce_eager"]}, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40960,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = tmp_path_factory.mktemp("bench-vllm") / "tiny-llama"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    return str(out)


@pytest.fixture
def fake_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    venv = tmp_path / "venv-vllm"
    (venv / "bin").mkdir(parents=True)
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE_DRIVER)
    python = venv / "bin" / "python"
    # Called as: python DRIVER REQUESTS RESULT
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{driver}" "$2" "$3"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PAGED_VLLM_VENV", str(venv))
    return venv


def test_missing_vllm_environment_fails_before_our_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PAGED_VLLM_VENV", str(tmp_path / "absent"))
    rc = main(["bench", "decode-1", "--baseline", "vllm", "--no-progress", "--json", str(tmp_path / "r.json")])
    assert rc != 0
    assert "bash benchmarks/vllm_env.sh" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_vllm_baselines_in_the_report(tiny_model: str, fake_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    rc = main(
        [
            "bench",
            "throughput",
            "--num-requests",
            "2",
            "--output-len",
            "3",
            "--model",
            tiny_model,
            "--backend",
            "reference",
            "--kv-cache-memory",
            "16MiB",
            "--baseline",
            "vllm,vllm-compiled",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert validate_report(report) == []
    paged, eager, compiled = report["runs"]
    assert [r["name"] for r in report["runs"]] == ["paged", "vllm", "vllm-compiled"]
    assert eager["output_tokens"] == compiled["output_tokens"] == paged["output_tokens"] == 6
    assert eager["prompt_tokens"] == paged["prompt_tokens"]
    assert (eager["seconds"], eager["steps"], eager["startup_s"]) == (4.0, 9, 20.0)
    assert eager["ttft_s"]["values"] == [0.5, 0.5]
    assert report["ratios"]["paged_vs_vllm"] == pytest.approx(paged["output_tok_s"] / 1.5)


def test_vllm_refuses_another_gguf(
    tmp_path: Path, fake_venv: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF")
    rc = main(["bench", "decode-1", "--baseline", "vllm", "--model", str(gguf), "--no-progress"])
    assert rc != 0
    assert "this run's model is" in capsys.readouterr().err
