"""``paged bench`` end to end: every workload at a tiny size through the CLI, JSON validated, plot written.

A random-weight Llama small enough to run in seconds stands in for the
embedded model; its vocabulary covers the workloads' token ids and its
context the ``long`` workload's 4k prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from paged_bench.schema import validate_report
from paged_core.cli.main import main
from paged_core.registry import load_registry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40960,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = tmp_path_factory.mktemp("bench") / "tiny-llama"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    return str(out)


def backend() -> str:
    """The compiled CPU backend when installed (fast), else the reference backend."""
    names = {r.name for r in load_registry().records() if r.selectable}
    return "cpu" if "cpu" in names else "reference"


def bench(tmp_path: Path, model: str | None, *args: str) -> dict[str, Any]:
    """Run ``paged bench`` in-process; returns the JSON report after checking both files were written."""
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    engine = ["--model", model, "--backend", backend(), "--kv-cache-memory", "16MiB"] if model else []
    rc = main(["bench", *args, *engine, "--json", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    report: dict[str, Any] = json.loads(out.read_text())
    assert validate_report(report) == []
    return report


def test_throughput_with_every_baseline(tiny_model: str, tmp_path: Path) -> None:
    r = bench(
        tmp_path,
        tiny_model,
        "throughput",
        "--num-requests",
        "2",
        "--output-len",
        "4",
        "--baseline",
        "hf-static,hf-cb,reference",
    )
    assert [run["name"] for run in r["runs"]] == ["paged", "hf-static", "hf-cb", "reference"]
    output = {"paged_vs_hf-static", "paged_vs_hf-cb", "paged_vs_reference"}
    # Decode tok/s where the other system measured it too (hf-static: both requests in one batch).
    assert set(r["ratios"]) == output | {"decode_paged_vs_hf-static", "decode_paged_vs_reference"}
    assert all(run["output_tokens"] == 8 for run in r["runs"])
    assert r["roofline"]["kind"] == "flops" and r["roofline"]["gemm"]["shape"] == [256, 576, 49152]
    figures = ["paged_vs_hf-static", "paged_vs_hf-cb", "roofline_fraction", "constrained_vs_same_lengths"]
    kv = ["kv_fp8_e4m3_vs_auto", "nll_fp8_e4m3_agreement", "nll_int8_agreement"]
    assert [g["figure"] for g in r["goals"]] == [*figures, "lora_vs_paged", *kv]
    assert all(g["value"] is None for g in r["goals"][-5:])  # no --constrained, --lora, --kv-dtypes
    assert r["kv_dtypes"] is None
    # Ours runs as a user starts it: dtype auto, resolved for this CPU and recorded.
    assert r["config"]["engine"]["dtype"] == "auto"
    assert r["engine"]["dtype"] in ("bfloat16", "float32") and r["engine"]["model_path"] == "fused"
    assert r["machine"]["versions"]["torch"] and r["engine"]["backend"] == backend()


def test_prefix_caching_on_and_off(tiny_model: str, tmp_path: Path) -> None:
    r = bench(tmp_path, tiny_model, "prefix", "--num-requests", "3", "--output-len", "2")
    on, off = r["runs"]
    assert (on["name"], off["name"]) == ("paged", "paged-no-prefix-cache")
    assert off["prefill_tokens_computed"] == 3 * (1024 + 64)
    # At least one request found the 1,024-token system prompt cached.
    assert on["prefill_tokens_computed"] <= off["prefill_tokens_computed"] - 1024
    assert on["prefix_hit_rate"] > 0 and off["prefix_hit_rate"] is None
    assert len(on["ttft_s"]["values"]) == 3
    assert 0 < r["ratios"]["prefill_reduction"] < 1


def test_kv_util_needs_no_model(tmp_path: Path) -> None:
    r = bench(tmp_path, None, "kv-util", "--num-requests", "40", "--kv-tokens", "8192")
    kv = r["kv_util"]
    assert r["runs"] == [] and r["workload_stats"]["num_requests"] == 40
    assert kv["reserved"]["peak_concurrent"] == 8192 // 2048
    assert kv["paged"]["peak_concurrent"] > kv["reserved"]["peak_concurrent"]
    kv_dtypes = ["peak_concurrency_fp8_e4m3_vs_bfloat16", "peak_concurrency_int8_vs_bfloat16"]  # --kv-dtypes
    assert [g["figure"] for g in r["goals"]] == ["utilization", "peak_concurrency_ratio", *kv_dtypes]


def test_decode_1_bandwidth_roofline(tiny_model: str, tmp_path: Path) -> None:
    r = bench(tmp_path, tiny_model, "decode-1", "--output-len", "6")
    (run,) = r["runs"]
    assert run["num_requests"] == 1 and run["output_tokens"] == 6 and run["decode_tok_s"] > 0
    assert r["roofline"]["kind"] == "bandwidth" and r["roofline"]["weight_bytes_per_token"] > 0


def test_long_context(tiny_model: str, tmp_path: Path) -> None:
    r = bench(tmp_path, tiny_model, "long", "--num-requests", "1", "--output-len", "2")
    assert r["runs"][0]["prompt_tokens"] == 4096 and r["roofline"] is None


def test_bad_baseline_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "throughput", "--baseline", "sglang"]) == 1
    assert "unknown baseline(s) sglang" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random Qwen3-MoE (8 experts, top-2) whose vocabulary is smaller than the workloads' ids (folded in)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = tmp_path_factory.mktemp("bench") / "tiny-qwen3-moe"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    return str(out)


def test_decode_1_on_a_moe_model(tiny_moe: str, tmp_path: Path) -> None:
    r = bench(tmp_path, tiny_moe, "decode-1", "--output-len", "6", "--baseline", "hf-static")
    ours, hf = r["runs"]
    assert (ours["name"], hf["name"]) == ("paged", "hf-static")
    assert all(run["output_tokens"] == 6 and run["decode_tok_s"] > 0 for run in r["runs"])
    # transformers ran the model's own experts modules: every layer, every forward (a prefill and 5 decode steps).
    assert hf["experts_calls"] == 2 * 6
    assert r["ratios"]["decode_paged_vs_hf-static"] == pytest.approx(ours["decode_tok_s"] / hf["decode_tok_s"])
    moe = r["roofline"]["moe"]
    assert (moe["num_layers"], moe["num_experts"], moe["top_k"]) == (2, 8, 2)
    assert moe["experts_modules"] == ["Qwen3MoeExperts"] and r["model"]["moe"] == moe
    element = 2 if r["engine"]["dtype"] == "bfloat16" else 4
    assert moe["expert_bytes"] == 2 * 8 * 3 * 64 * 32 * element
    assert moe["active_expert_bytes_per_token"] == moe["expert_bytes"] // 4
    roof = r["roofline"]
    assert roof["weight_bytes_per_token"] == roof["total_weight_bytes"] - moe["expert_bytes"] * 3 // 4
    share = moe["active_expert_bytes_per_token"] / roof["weight_bytes_per_token"]
    assert moe["active_expert_share"] == pytest.approx(share)
    assert roof["bound_tok_s"] == pytest.approx(roof["peak_bytes_per_s"] / roof["weight_bytes_per_token"])
    assert r["engine"]["model_path"] == "fused"
