"""The vllm baselines' paged side: finding vLLM's environment, its settings, and the driver protocol.

vLLM itself is never installed here: a fake driver script (run by this
interpreter) stands in for it, reading the request file and writing a result
as the real driver does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_bench import vllm_run
from paged_bench.machine import machine_info
from paged_bench.options import BenchOptions
from paged_bench.report import build_report
from paged_bench.result import RunResult
from paged_bench.schema import validate_report
from paged_bench.vllm_run import VLLMRunResult, cpu_list, driver_env, find_venv, resolve_model, run_vllm
from paged_bench.workloads import BenchRequest, throughput
from paged_core.engine_config import EngineConfig
from paged_core.errors import ConfigError

FAKE_DRIVER = """
import json, os, sys
spec = json.load(open(sys.argv[1]))
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "fail":
    print("vLLM exploded: no such kernel", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    import time
    time.sleep(60)
reqs = spec["requests"]
n = len(reqs)
tokens = [r["max_tokens"] for r in reqs]
if mode == "short":
    tokens[0] -= 1
json.dump({
    "seconds": 2.0, "num_requests": n, "prompt_tokens": sum(len(r["prompt_token_ids"]) for r in reqs),
    "output_tokens": sum(tokens), "per_request_output_tokens": tokens,
    "ttft": [0.1 * (i + 1) for i in range(n)], "decode_tok_s": 50.0, "steps": 7, "cached_prompt_tokens": 4,
    "startup_s": 12.5, "warmup_s": 1.0, "vllm_version": "fake",
}, open(sys.argv[2], "w"))
json.dump({"spec": spec, "env": {k: os.environ.get(k) for k in (
    "LD_PRELOAD", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "PYTHONPATH")}},
    open(os.environ["FAKE_SEEN"], "w"))
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A stand-in vLLM environment: bin/python, Intel OpenMP and the bf16 model directory."""
    root = tmp_path / "venv-vllm"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\n")
    (root / "lib").mkdir()
    (root / "lib" / "libiomp5.so").write_bytes(b"")
    (root / vllm_run.MODEL_DIR).mkdir()
    (root / vllm_run.MODEL_DIR / "config.json").write_text("{}")
    return root


@pytest.fixture
def fake_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fake_driver.py"
    path.write_text(FAKE_DRIVER)
    monkeypatch.setenv("FAKE_SEEN", str(tmp_path / "seen.json"))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/of/paged")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    return path


def requests() -> list[BenchRequest]:
    return [BenchRequest([101, 102, 103], 4), BenchRequest([104, 105], 2), BenchRequest([106] * 5, 3)]


def test_baselines_are_options() -> None:
    opts = BenchOptions("throughput", baselines=("vllm", "vllm-compiled"))
    assert opts.to_dict()["baselines"] == ["vllm", "vllm-compiled"]
    assert set(vllm_run.VLLM_MODES) == {"vllm", "vllm-compiled"}
    assert vllm_run.VLLM_MODES["vllm"] is True and vllm_run.VLLM_MODES["vllm-compiled"] is False


def test_missing_environment_names_the_setup_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_run, "_repo_root", lambda: tmp_path)
    with pytest.raises(ConfigError, match=r"bash benchmarks/vllm_env\.sh"):
        find_venv(env={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"PAGED_VLLM_VENV=.*nowhere.*bash benchmarks/vllm_env\.sh"):
        find_venv(env={"PAGED_VLLM_VENV": str(tmp_path / "nowhere")})
    # Through the entry point too, before anything is run.
    monkeypatch.setenv("PAGED_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"vllm_env\.sh"):
        run_vllm("vllm", requests(), EngineConfig.of())


def test_environment_found_from_a_subfolder_or_the_variable(tmp_path: Path, venv: Path) -> None:
    default = tmp_path / "repo" / vllm_run.DEFAULT_VENV
    (default / "bin").mkdir(parents=True)
    (default / "bin" / "python").write_text("")
    sub = tmp_path / "repo" / "core" / "tests"
    sub.mkdir(parents=True)
    assert find_venv(env={}, cwd=sub) == default.resolve()
    assert find_venv(env={"PAGED_VLLM_VENV": str(venv)}, cwd=sub) == venv


def test_model_is_the_bf16_copy_or_a_safetensors_directory(tmp_path: Path, venv: Path) -> None:
    assert resolve_model(None, venv) == venv / vllm_run.MODEL_DIR
    st = tmp_path / "st"
    st.mkdir()
    (st / "config.json").write_text("{}")
    assert resolve_model(str(st), venv) == st.resolve()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"this run's model is '.*other\.gguf'"):
        resolve_model(str(other), venv)
    (venv / vllm_run.MODEL_DIR / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"smollm2-bf16 is missing.*vllm_env\.sh"):
        resolve_model(None, venv)


def test_cpu_list() -> None:
    assert cpu_list([1, 0]) == "0-1"
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpu_list([3]) == "3"
    with pytest.raises(ValueError):
        cpu_list([])


def test_driver_env_follows_the_cpu_guide(tmp_path: Path, venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libdir = tmp_path / "syslib"
    libdir.mkdir()
    (libdir / vllm_run.TCMALLOC).write_bytes(b"")
    monkeypatch.setattr(vllm_run, "TCMALLOC_DIRS", (str(tmp_path / "absent"), str(libdir)))
    monkeypatch.setattr(vllm_run, "_cores", lambda: [0, 1])
    env = driver_env(venv, 4 * 2**30, base={"LD_PRELOAD": "/opt/mine.so", "PYTHONPATH": "x", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{libdir / vllm_run.TCMALLOC}:{venv / 'lib' / 'libiomp5.so'}:/opt/mine.so"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "PYTHONPATH" not in env and env["PATH"] == "/bin"
    # A budget that is not whole GiB goes as bytes in the request file only; what the user set is kept.
    env = driver_env(venv, 3 * 2**29, base={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    monkeypatch.setattr(vllm_run, "TCMALLOC_DIRS", ())
    (venv / "lib" / "libiomp5.so").unlink()
    assert "LD_PRELOAD" not in driver_env(venv, 2**30, base={})


def test_engine_settings_mirror_our_config() -> None:
    cfg = EngineConfig.of(
        dtype="bfloat16",
        kv_cache_memory="2GiB",
        max_num_seqs=64,
        max_num_batched_tokens=1024,
        seed=5,
        enable_prefix_caching=False,
    )
    s = vllm_run.engine_settings(cfg, enforce_eager=True)
    assert s == {
        "dtype": "bfloat16",
        "kv_cache_bytes": 2 * 2**30,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 1024,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "max_model_len": None,
        "seed": 5,
    }
    assert vllm_run.engine_settings(EngineConfig.of(), enforce_eager=False)["kv_cache_bytes"] == 4 * 2**30
    assert vllm_run.engine_settings(EngineConfig.of(), enforce_eager=False)["dtype"] == "bfloat16"


def _run(venv: Path, driver: Path, name: str = "vllm", **kwargs: Any) -> VLLMRunResult:
    cfg = EngineConfig.of(dtype="bfloat16", kv_cache_memory="4GiB", enable_prefix_caching=True)
    return run_vllm(name, requests(), cfg, progress=False, venv=venv, python=sys.executable, driver=driver, **kwargs)


def test_driver_protocol_makes_a_run_result(tmp_path: Path, venv: Path, fake_driver: Path) -> None:
    result = _run(venv, fake_driver)
    assert isinstance(result, RunResult)
    assert (result.name, result.seconds, result.num_requests) == ("vllm", 2.0, 3)
    assert (result.prompt_tokens, result.output_tokens) == (10, 9)
    assert result.ttft == pytest.approx([0.1, 0.2, 0.3])
    assert (result.decode_tok_s, result.steps, result.startup_s) == (50.0, 7, 12.5)
    assert result.prefill_tokens_computed == 6 and result.prefix_hit_rate == pytest.approx(0.4)
    assert result.output_tok_s == pytest.approx(4.5)
    assert result.to_dict()["startup_s"] == 12.5
    seen = json.loads((tmp_path / "seen.json").read_text())
    spec = seen["spec"]
    assert [r["prompt_token_ids"] for r in spec["requests"]] == [r.prompt_token_ids for r in requests()]
    assert [r["max_tokens"] for r in spec["requests"]] == [4, 2, 3]
    assert spec["model"] == str(venv / vllm_run.MODEL_DIR)
    assert spec["engine"]["enforce_eager"] is True and spec["engine"]["kv_cache_bytes"] == 4 * 2**30
    assert seen["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert str(venv / "lib" / "libiomp5.so") in seen["env"]["LD_PRELOAD"]
    assert seen["env"]["PYTHONPATH"] is None
    assert seen["env"]["VLLM_CPU_OMP_THREADS_BIND"]

    compiled = _run(venv, fake_driver, name="vllm-compiled")
    assert compiled.name == "vllm-compiled"
    assert json.loads((tmp_path / "seen.json").read_text())["spec"]["engine"]["enforce_eager"] is False


def test_vllm_run_in_a_valid_report(venv: Path, fake_driver: Path) -> None:
    reqs = throughput(3)
    ours = RunResult("paged", 1.0, 3, sum(len(r.prompt_token_ids) for r in reqs), sum(r.max_tokens for r in reqs))
    theirs = VLLMRunResult("vllm", 2.0, 3, ours.prompt_tokens, ours.output_tokens, ttft=[0.1, 0.2, 0.3], startup_s=15.0)
    report = build_report(
        config=BenchOptions("decode-1", baselines=("vllm",)).to_dict(),
        machine=machine_info(torch.device("cpu")),
        requests=reqs,
        runs=[ours, theirs],
        argv=["paged"],
    )
    assert validate_report(report) == []
    assert report["runs"][1]["startup_s"] == 15.0
    assert report["ratios"]["paged_vs_vllm"] == pytest.approx(2.0)
    report["runs"][1]["startup_s"] = "slow"
    assert any("startup_s" in e for e in validate_report(report))


def test_driver_failure_quotes_its_output(venv: Path, fake_driver: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "fail")
    with pytest.raises(RuntimeError, match=r"(?s)exit status 3.*vLLM exploded: no such kernel"):
        _run(venv, fake_driver)


def test_wrong_token_counts_are_refused(venv: Path, fake_driver: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "short")
    with pytest.raises(RuntimeError, match="does not match the workload"):
        _run(venv, fake_driver)


def test_timeout_ends_the_driver(venv: Path, fake_driver: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "hang")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within 1"):
        _run(venv, fake_driver, timeout=1)
    assert time.monotonic() - start < 30


def test_unknown_mode(venv: Path, fake_driver: Path) -> None:
    with pytest.raises(ValueError, match="unknown vLLM baseline 'vllm-fast'"):
        _run(venv, fake_driver, name="vllm-fast")
