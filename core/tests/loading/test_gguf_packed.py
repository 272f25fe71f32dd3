"""Loading a GGUF with packed linear weights: values, row order, tied head, and refusals naming the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paged_core.errors import ConfigError, WeightFormatError
from paged_core.loading.gguf_packed import load_packed_gguf
from paged_core.loading.loader import ModelSource, load_model, serves_packed
from paged_core.quant import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0
from paged_core.runner.packed_linear import PackedLinearModule, packed_modules

from ..gguf_helpers import dense_oracle, tiny_config, write_tiny_gguf

MIXED = {
    "self_attn.q_proj": Q4_1,
    "self_attn.k_proj": Q8_0,
    "self_attn.v_proj": Q6_K,
    "self_attn.o_proj": Q4_0,
    "mlp.gate_proj": Q4_K,
    "mlp.up_proj": Q4_K,
    "mlp.down_proj": Q6_K,
}


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=ids).logits[0]
    return out


@pytest.mark.parametrize(
    ("formats", "embed", "tie"),
    [
        (Q4_1, Q8_0, True),
        (Q4_0, None, True),
        (Q8_0, None, False),
        (MIXED, Q4_1, True),
    ],
    ids=["q4_1-tied-q8_0-head", "q4_0-dense-embed", "q8_0-untied", "mixed-k-quants"],
)
def test_packed_load_equals_the_dequantized_values(tmp_path: Path, formats: object, embed: object, tie: bool) -> None:
    config = tiny_config(tie)
    path = tmp_path / "tiny.gguf"
    values = write_tiny_gguf(path, config, formats, embed)  # type: ignore[arg-type]
    model = load_packed_gguf(path, config, torch.float32).eval()
    mods = dict(packed_modules(model))
    assert len(mods) == 7 * config.num_hidden_layers + (1 if (not tie or embed is not None) else 0)
    if tie and embed is not None:  # the tied head reads the embedding's packed bytes
        assert mods["lm_head"].qweight.format is embed
    ids = torch.tensor([[1, 5, 77, 300, 12, 9, 250, 3]])
    want = _logits(dense_oracle(config, values), ids)
    got = _logits(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_q_and_k_rows_come_back_in_transformers_order(tmp_path: Path) -> None:
    config = tiny_config()
    path = tmp_path / "tiny.gguf"
    values = write_tiny_gguf(path, config, Q8_0)
    model = load_packed_gguf(path, config, torch.float32)
    q = model.model.layers[1].self_attn.q_proj
    assert isinstance(q, PackedLinearModule)
    torch.testing.assert_close(q.qweight.dequantize(), values["model.layers.1.self_attn.q_proj.weight"])
    k = model.model.layers[0].self_attn.k_proj
    torch.testing.assert_close(k.qweight.dequantize(), values["model.layers.0.self_attn.k_proj.weight"])


def test_a_tensor_whose_shape_disagrees_with_the_config_is_refused_by_name(tmp_path: Path) -> None:
    config = tiny_config()
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, config, Q4_1, break_tensor="blk.1.ffn_up.weight")
    with pytest.raises(WeightFormatError, match=r"blk\.1\.ffn_up\.weight: shape \[out 511, in 256\]"):
        load_packed_gguf(path, config, torch.float32)


def test_int8_on_an_already_quantized_gguf_says_why(tmp_path: Path) -> None:
    config = tiny_config()
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, config, Q4_1)
    with pytest.raises(
        ConfigError,
        match=r"--quantization int8 cannot apply to tiny\.gguf: its weights are already "
        r"quantized \(Q4_1\)",
    ):
        load_model(
            ModelSource(tmp_path, "tiny.gguf", "tiny"), config, torch.float32, torch.device("cpu"), "sdpa", "int8"
        )


def test_none_dequantizes_every_tensor(tmp_path: Path) -> None:
    config = tiny_config()
    path = tmp_path / "tiny.gguf"
    values = write_tiny_gguf(path, config, Q4_1)
    model = load_packed_gguf(path, config, torch.float32)
    assert packed_modules(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    oracle = dense_oracle(config, values)
    torch.testing.assert_close(_logits(model.eval(), ids), _logits(oracle, ids), rtol=1e-4, atol=1e-4)


def test_serves_packed_says_when_the_linears_stay_packed(tmp_path: Path) -> None:
    config = tiny_config()
    write_tiny_gguf(tmp_path / "tiny.gguf", config, Q4_1)
    gguf = ModelSource(tmp_path, "tiny.gguf", "tiny")
    dense = ModelSource(tmp_path, None, "tiny")
    assert serves_packed(gguf, "auto") and not serves_packed(gguf, "none")
    assert serves_packed(dense, "int8") and not serves_packed(dense, "auto")
