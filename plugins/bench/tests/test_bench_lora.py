"""``paged bench throughput --lora N``: the random adapters, the option, the report's figures, and a tiny run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_bench.cli import lora_limits, register
from paged_bench.lora import LORA, lora_engine_fields, round_robin, write_adapters
from paged_bench.options import BenchOptions
from paged_bench.report import goals, ratios
from paged_bench.result import RunResult
from paged_bench.schema import validate_report
from paged_bench.table import lora_lines
from paged_core.cli.main import main
from paged_core.lora.adapter import PROJECTIONS, load_adapter
from paged_core.lora.request import LoRARequest
from paged_core.registry import load_registry

# Two layers of a small decoder: (out, in) features of each projection (GQA: k and v narrower).
SHAPES = {
    (i, m): shape
    for i in range(2)
    for m, shape in {
        "q_proj": (32, 32),
        "k_proj": (16, 32),
        "v_proj": (16, 32),
        "o_proj": (32, 32),
        "gate_proj": (48, 32),
        "up_proj": (48, 32),
        "down_proj": (32, 48),
    }.items()
}


def test_the_adapters_load_as_peft_checkpoints_of_the_model(tmp_path: Path) -> None:
    adapters = write_adapters(tmp_path, SHAPES, 3, 8, seed=0)
    assert [(a.name, a.id) for a in adapters] == [("bench-lora-0", 1), ("bench-lora-1", 2), ("bench-lora-2", 3)]
    config = json.loads((Path(adapters[0].path) / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["bias"] == "none"
    assert config["target_modules"] == list(PROJECTIONS)
    loaded = [load_adapter(a.name, a.id, a.path, SHAPES, max_rank=16) for a in adapters]
    for adapter in loaded:
        assert adapter.rank == 8 and adapter.targets == frozenset(PROJECTIONS) and set(adapter.weights) == set(SHAPES)
        a, b = adapter.weights[(1, "down_proj")]
        assert a.shape == (8, 48) and b.shape == (32, 8)
        assert 0 < a.abs().max() <= 1 / 48**0.5 and 0 < b.abs().max() < 1  # small, and not PEFT's zero B
    # Distinct adapters, the same ones again for the same seed, others for another seed.
    q = [ad.weights[(0, "q_proj")][0] for ad in loaded]
    assert not torch.equal(q[0], q[1])
    again = write_adapters(tmp_path / "again", SHAPES, 1, 8, seed=0)[0]
    assert torch.equal(load_adapter("x", 1, again.path, SHAPES, 16).weights[(0, "q_proj")][0], q[0])
    other = write_adapters(tmp_path / "other", SHAPES, 1, 8, seed=1)[0]
    assert not torch.equal(load_adapter("x", 1, other.path, SHAPES, 16).weights[(0, "q_proj")][0], q[0])


def test_requests_spread_round_robin() -> None:
    adapters = [LoRARequest(f"a{k}", k + 1, "/nowhere") for k in range(3)]
    assert [a.id for a in round_robin(7, adapters)] == [1, 2, 3, 1, 2, 3, 1]
    with pytest.raises(ValueError):
        round_robin(2, [])


def test_the_lora_engine_fits_the_adapters_unless_told() -> None:
    assert lora_engine_fields({}, 6, 32) == {"enable_lora": True, "max_loras": 6, "max_lora_rank": 32}
    assert lora_engine_fields({}, 2, 8) == {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}
    assert lora_engine_fields({"max_loras": 2, "max_lora_rank": 64}, 6, 16) == {"enable_lora": True}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["bench", "throughput", *argv])


def test_the_cli_raises_max_loras_and_rank_only_where_not_given() -> None:
    assert lora_limits(_parse()) == {"max_loras": 4, "max_lora_rank": 16}
    assert lora_limits(_parse("--lora", "6", "--lora-rank", "32")) == {"max_loras": 6, "max_lora_rank": 32}
    given = _parse("--lora", "6", "--max-loras", "2", "--max-lora-rank", "64")
    assert lora_limits(given) == {"max_loras": 2, "max_lora_rank": 64}  # as given
    assert lora_limits(_parse("--lora", "2", "--max-loras", "4")) == {"max_loras": 4, "max_lora_rank": 16}
    assert lora_limits(_parse("--lora-rank", "32")) == {"max_loras": 4, "max_lora_rank": 16}  # no --lora


def test_the_option_is_checked() -> None:
    opts = BenchOptions("throughput", lora=4, lora_rank=8)
    assert opts.to_dict()["lora"] == {"adapters": 4, "rank": 8}
    assert BenchOptions("throughput").to_dict()["lora"] is None
    BenchOptions("prefix", lora=2)  # any model workload
    with pytest.raises(ValueError, match="--lora needs a model workload"):
        BenchOptions("kv-util", lora=2)
    with pytest.raises(ValueError, match="lora must be an int >= 1"):
        BenchOptions("throughput", lora=0)
    with pytest.raises(ValueError, match="--lora-rank 32 is above --max-lora-rank 16"):
        BenchOptions("throughput", lora=2, lora_rank=32, engine={"max_lora_rank": 16})


def _lora_figures(loads: int = 0) -> dict[str, Any]:
    return {
        "adapters": 4,
        "rank": 16,
        "targets": list(PROJECTIONS),
        "assignment": "round-robin",
        "max_loras": 4,
        "max_lora_rank": 16,
        "slot_loads": loads,
    }


def test_the_ratio_goal_and_summary_lines() -> None:
    base = RunResult("paged", 2.0, 4, 100, 40)
    lora = RunResult(LORA, 2.5, 4, 100, 40, lora=_lora_figures())
    got = ratios([base, lora])
    assert got["lora_vs_paged"] == pytest.approx(0.8) and got["paged_vs_paged-lora"] == pytest.approx(1.25)
    goal = {g["figure"]: g for g in goals("throughput", got)}["lora_vs_paged"]
    assert (goal["goal"], goal["target"], goal["met"]) == ("LoRA output tok/s vs the base model", 0.75, True)
    slow = RunResult(LORA, 4.0, 4, 100, 40, lora=_lora_figures(loads=3))
    assert {g["figure"]: g for g in goals("throughput", ratios([base, slow]))}["lora_vs_paged"]["met"] is False
    assert "lora_vs_paged" not in ratios([base])
    lines = lora_lines({"runs": [base.to_dict(), lora.to_dict()], "ratios": got})
    assert "16.0 output tok/s on 4 adapters of rank 16" in lines[0] and "base model 20.0: 0.80x" in lines[0]
    assert "0 adapter loads into device slots" in lines[1]
    assert lora_lines({"runs": [base.to_dict()], "ratios": {}}) == []
    assert "lora" not in base.to_dict() and lora.to_dict()["lora"]["adapters"] == 4


def backend() -> str:
    """The compiled CPU backend when installed (fast), else the reference backend."""
    return "cpu" if any(r.name == "cpu" and r.selectable for r in load_registry().records()) else "reference"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
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
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    out = tmp_path_factory.mktemp("bench") / "tiny-llama"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.save_pretrained(out)
    return str(out)


def _bench(tiny_model: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    args = ["bench", "throughput", "--num-requests", "4", "--output-len", "4", *extra]
    args += ["--model", tiny_model, "--backend", backend(), "--kv-cache-memory", "16MiB"]
    assert main([*args, "--json", str(out), "--no-progress"]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert validate_report(report) == []
    return report


def test_a_lora_run_beside_the_base_model(tiny_model: str, tmp_path: Path) -> None:
    r = _bench(tiny_model, tmp_path, "--lora", "2", "--lora-rank", "8")
    base, lora = r["runs"]
    assert (base["name"], lora["name"]) == ("paged", LORA)
    assert r["config"]["lora"] == {"adapters": 2, "rank": 8}
    assert base["output_tokens"] == lora["output_tokens"] == 4 * 4
    assert base["prompt_tokens"] == lora["prompt_tokens"]
    assert r["ratios"]["lora_vs_paged"] == pytest.approx(lora["output_tok_s"] / base["output_tok_s"])
    goal = {g["figure"]: g for g in r["goals"]}["lora_vs_paged"]
    assert goal["value"] == r["ratios"]["lora_vs_paged"] and goal["met"] == (goal["value"] >= 0.75)
    # Both adapters were put in slots by the warm-up, and stay there: no copies while timed.
    assert lora["lora"] == {
        "adapters": 2,
        "rank": 8,
        "targets": list(PROJECTIONS),
        "assignment": "round-robin",
        "max_loras": 4,
        "max_lora_rank": 16,
        "slot_loads": 0,
    }
    assert "lora" not in base


def test_fewer_slots_than_adapters_swap_while_timed(tiny_model: str, tmp_path: Path) -> None:
    r = _bench(tiny_model, tmp_path, "--lora", "3", "--max-loras", "1")
    lora = r["runs"][1]["lora"]
    assert lora["max_loras"] == 1 and lora["adapters"] == 3
    # Requests of the adapter in the slot run first; each other adapter is copied in when its turn comes.
    assert lora["slot_loads"] >= 2
