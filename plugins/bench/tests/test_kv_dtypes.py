"""``paged bench --kv-dtypes``: the option, the ratios and goals, and tiny runs of throughput and kv-util."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_bench import kv_dtypes
from paged_bench.cli import options_from, register
from paged_bench.kv_dtypes import (
    RUN_PREFIX,
    fixed_text,
    kv_dtype_lines,
    kv_util_ratios,
    parse_kv_dtypes,
    throughput_ratios,
)
from paged_bench.options import BenchOptions
from paged_bench.report import goals
from paged_bench.schema import validate_report
from paged_core.cli.main import main


def test_the_names_are_checked_and_fp8_is_e4m3() -> None:
    assert parse_kv_dtypes("auto, bfloat16,fp8,int8,fp8_e4m3") == ("auto", "bfloat16", "fp8_e4m3", "int8")
    assert parse_kv_dtypes("") == ()
    with pytest.raises(ValueError, match=r"unknown KV dtype\(s\) int4; choose from auto, float32, .*int8"):
        parse_kv_dtypes("int8,int4")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_the_options_reach_the_engine_and_the_bench() -> None:
    opts = options_from(_parse("throughput", "--kv-cache-dtype", "fp8", "--kv-dtypes", "auto,int8"))
    assert opts.engine["kv_cache_dtype"] == "fp8" and opts.kv_dtypes == ("auto", "int8")
    assert opts.to_dict()["kv_dtypes"] == ["auto", "int8"]
    assert options_from(_parse("kv-util", "--kv-dtypes", "int8")).kv_dtypes == ("int8",)
    with pytest.raises(ValueError, match="--kv-dtypes applies to the throughput and kv-util workloads, not 'prefix'"):
        BenchOptions("prefix", kv_dtypes=("int8",))


def test_throughput_ratios_divide_by_auto() -> None:
    entries = [
        {"name": "auto", "output_tok_s": 100.0, "nll": 2.0},
        {"name": "fp8_e4m3", "output_tok_s": 95.0, "nll": 2.03},
        {"name": "int8", "output_tok_s": 80.0, "nll": 1.99},
    ]
    got = throughput_ratios(entries)
    assert got["kv_fp8_e4m3_vs_auto"] == pytest.approx(0.95) and got["kv_int8_vs_auto"] == pytest.approx(0.8)
    assert got["nll_fp8_e4m3_vs_auto"] == pytest.approx(1.015) and got["nll_int8_agreement"] == pytest.approx(0.995)
    met = {g["figure"]: g["met"] for g in goals("throughput", got)}
    assert met["kv_fp8_e4m3_vs_auto"] is True
    assert met["nll_fp8_e4m3_agreement"] is False  # 1.5% off
    assert met["nll_int8_agreement"] is True
    assert throughput_ratios(entries[1:]) == {}  # no auto run: nothing to divide by


def test_kv_util_ratios_divide_by_bfloat16() -> None:
    entries = [
        {"name": "bfloat16", "slots": 1000, "peak_concurrent": 50},
        {"name": "int8", "slots": 1939, "peak_concurrent": 97},
    ]
    got = kv_util_ratios(entries)
    assert got == {"peak_concurrency_int8_vs_bfloat16": 97 / 50, "kv_slots_int8_vs_bfloat16": 1.939}
    met = {g["figure"]: g["met"] for g in goals("kv-util", got)}
    assert met["peak_concurrency_int8_vs_bfloat16"] is True and met["peak_concurrency_fp8_e4m3_vs_bfloat16"] is None


def test_the_fixed_text_is_the_repositorys_license() -> None:
    text = fixed_text()
    assert text == (Path(__file__).resolve().parents[3] / "LICENSE").read_text()
    assert "Apache License" in text and len(text) > 10_000


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama with a byte-level tokenizer (so the NLL text has ids), vocabulary big enough for the
    workloads' random prompt ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40960,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = tmp_path_factory.mktemp("bench-kv") / "tiny-llama"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)  # type: ignore[no-untyped-call]
    # Every byte one token (ids 0-255), as core's engine tests do.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)} | {"<s>": 256, "</s>": 257}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(out)
    return str(out)


def _bench(args: list[str], tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "out.json"
    assert main(["bench", *args, "--json", str(out), "--no-progress"]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert validate_report(report) == []
    return report


def test_throughput_runs_each_kv_dtype_on_the_same_weights(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shorter text than the LICENSE: the reference backend attends row by row.
    monkeypatch.setattr(kv_dtypes, "fixed_text", lambda: fixed_text()[:300])
    args = ["throughput", "--num-requests", "3", "--output-len", "3", "--model", tiny_model, "--backend", "reference"]
    r = _bench(
        [*args, "--dtype", "float32", "--kv-cache-memory", "16MiB", "--kv-dtypes", "auto,int8,fp8,bfloat16"], tmp_path
    )
    names = [run["name"] for run in r["runs"]]
    assert names == ["paged", f"{RUN_PREFIX}int8", f"{RUN_PREFIX}fp8_e4m3", f"{RUN_PREFIX}bfloat16"]
    assert len({run["output_tokens"] for run in r["runs"]}) == 1
    kv = r["kv_dtypes"]
    by = {e["name"]: e for e in kv["entries"]}
    assert list(by) == ["auto", "int8", "fp8_e4m3", "bfloat16"]
    assert (by["auto"]["kv_dtype"], by["int8"]["kv_dtype"], by["fp8_e4m3"]["kv_dtype"]) == (
        "float32",
        "int8",
        "fp8_e4m3",
    )
    # One 16 MiB budget: 2 layers x K/V x 16 tokens x one KV head of 64 (+2 scale bytes when quantized).
    assert by["auto"]["bytes_per_block"] == 2 * 2 * 16 * 64 * 4 and by["int8"]["bytes_per_block"] == 2 * 2 * 16 * 66
    assert by["int8"]["num_blocks"] == 16 * 2**20 // (2 * 2 * 16 * 66) - 1
    assert kv["nll_tokens"] == 300  # one byte a token
    nll = {n: e["nll"] for n, e in by.items()}
    assert all(v > 0 for v in nll.values()) and len(set(nll.values())) == 4  # each cache's own rounding
    for name in ("int8", "fp8_e4m3", "bfloat16"):
        assert r["ratios"][f"nll_{name}_vs_auto"] == pytest.approx(nll[name] / nll["auto"])
        assert abs(nll[name] / nll["auto"] - 1) < 0.05
    assert r["ratios"]["kv_int8_vs_auto"] == pytest.approx(by["int8"]["output_tok_s"] / by["auto"]["output_tok_s"])
    goal = {g["figure"]: g for g in r["goals"]}["kv_fp8_e4m3_vs_auto"]
    assert goal["value"] == r["ratios"]["kv_fp8_e4m3_vs_auto"]
    assert r["engine"]["kv_cache_dtype"] == "float32"
    lines = kv_dtype_lines(r)
    assert lines[1].startswith("KV int8 (int8 on reference): ") and "vs auto" in lines[1]


def test_kv_util_gives_each_kv_dtype_the_blocks_one_byte_budget_holds(tiny_model: str, tmp_path: Path) -> None:
    args = ["kv-util", "--num-requests", "40", "--kv-tokens", "4096", "--model", tiny_model, "--backend", "reference"]
    r = _bench([*args, "--kv-cache-dtype", "bfloat16", "--kv-dtypes", "int8,float32"], tmp_path)
    kv = r["kv_dtypes"]
    by = {e["name"]: e for e in kv["entries"]}
    assert list(by) == ["bfloat16", "int8", "float32"]
    assert kv["budget_bytes"] == 256 * by["bfloat16"]["bytes_per_block"]  # --kv-tokens 4096 of bf16: 256 blocks
    assert (by["bfloat16"]["num_blocks"], by["int8"]["num_blocks"], by["float32"]["num_blocks"]) == (256, 496, 128)
    assert r["ratios"]["kv_slots_int8_vs_bfloat16"] == pytest.approx(496 / 256)
    peak = r["ratios"]["peak_concurrency_int8_vs_bfloat16"]
    assert peak == by["int8"]["peak_concurrent"] / by["bfloat16"]["peak_concurrent"] and peak > 1.3
    assert by["float32"]["peak_concurrent"] < by["bfloat16"]["peak_concurrent"]
    # The main run is unchanged: --kv-tokens slots, whatever their dtype.
    assert r["kv_util"]["paged"]["peak_concurrent"] == by["bfloat16"]["peak_concurrent"]


def test_a_kv_dtype_the_backend_does_not_declare_fails_before_anything_runs(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from paged_core.reference import ReferenceBackend

    caps = ReferenceBackend.capabilities()
    floats = frozenset({torch.float32, torch.bfloat16, torch.float16})
    narrowed = type(caps)(**{**caps.__dict__, "kv_cache_dtypes": floats})
    monkeypatch.setattr(ReferenceBackend, "capabilities", classmethod(lambda cls: narrowed))
    args = ["bench", "throughput", "--num-requests", "2", "--output-len", "2", "--model", tiny_model]
    code = main([*args, "--backend", "reference", "--kv-dtypes", "int8", "--no-progress"])
    assert code != 0
    err = capsys.readouterr().err
    assert (
        "--kv-dtypes int8: backend 'reference' does not declare KV dtype int8 (it declares bfloat16, float16, "
        "float32); every KV dtype runs on the same backend and weights"
    ) in err
    assert "paged-kv" not in err  # refused before any run
