"""Loading PEFT checkpoints: scaling folded into B, and every refusal naming the adapter and the problem."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from paged_core.lora import LoRAError, LoRARequest, load_adapter

SHAPES = {(0, "q_proj"): (8, 4), (0, "down_proj"): (4, 6)}
PREFIX = "base_model.model.model.layers.0"


def _write(path: Path, config: dict[str, object], tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, path / "adapter_model.safetensors")
    return path


def _pair(r: int = 2) -> dict[str, torch.Tensor]:
    return {
        f"{PREFIX}.self_attn.q_proj.lora_A.weight": torch.ones(r, 4),
        f"{PREFIX}.self_attn.q_proj.lora_B.weight": torch.ones(8, r),
    }


@pytest.mark.parametrize(("rslora", "scale"), [(False, 8 / 2), (True, 8 / math.sqrt(2))])
def test_scaling_is_folded_into_b(tmp_path: Path, rslora: bool, scale: float) -> None:
    path = _write(tmp_path / "a", {"r": 2, "lora_alpha": 8, "use_rslora": rslora}, _pair())
    adapter = load_adapter("a", 1, str(path), SHAPES, max_rank=16)
    a, b = adapter.weights[(0, "q_proj")]
    assert adapter.rank == 2 and adapter.targets == {"q_proj"}
    assert torch.equal(a, torch.ones(2, 4)) and torch.allclose(b, torch.full((8, 2), scale))


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({"r": 2, "use_dora": True}, _pair(), "DoRA"),
        ({"r": 2, "bias": "all"}, _pair(), "bias='all'"),
        ({"r": 2, "modules_to_save": ["lm_head"]}, _pair(), "modules_to_save"),
        ({"r": 2, "peft_type": "IA3"}, _pair(), "only LORA"),
        ({"r": 32}, _pair(32), "rank 32, above max_lora_rank=16"),
        ({"r": 2}, {f"{PREFIX}.self_attn.q_proj.lora_A.weight": torch.ones(2, 4)}, "not both"),
        (
            {"r": 2},
            {
                f"{PREFIX}.self_attn.q_proj.lora_A.weight": torch.ones(2, 5),
                f"{PREFIX}.self_attn.q_proj.lora_B.weight": torch.ones(8, 2),
            },
            "another base model",
        ),
        (
            {"r": 2},
            {
                f"{PREFIX}.mlp.gate_proj.lora_A.weight": torch.ones(2, 4),
                f"{PREFIX}.mlp.gate_proj.lora_B.weight": torch.ones(8, 2),
            },
            "not a projection of the base",
        ),
        ({"r": 2}, {"base_model.model.lm_head.lora_A.weight": torch.ones(2, 4)}, "not a LoRA A or B"),
    ],
)
def test_bad_adapters_are_refused_by_name(
    tmp_path: Path, config: dict[str, object], tensors: dict[str, torch.Tensor], message: str
) -> None:
    path = _write(tmp_path / "bad", config, tensors)
    with pytest.raises(LoRAError, match="LoRA adapter 'bad'") as err:
        load_adapter("bad", 1, str(path), SHAPES, max_rank=16)
    assert message in str(err.value)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(LoRAError, match="no such directory"):
        load_adapter("x", 1, str(tmp_path / "none"), SHAPES, 16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoRAError, match=r"adapter_config\.json is missing"):
        load_adapter("x", 1, str(tmp_path / "empty"), SHAPES, 16)


def test_requests_check_their_fields() -> None:
    with pytest.raises(ValueError, match="id must be an int >= 1"):
        LoRARequest("a", 0, "/p")
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        LoRARequest("", 1, "/p")
