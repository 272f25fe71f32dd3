"""A GGUF MoE file's 3-D expert tensors kept packed: layout, values, the config's MoE sizes, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paged_core.errors import ConfigError, UnsupportedConfigError, WeightFormatError
from paged_core.loading.gguf_experts import LayerExperts, fix_moe_config, layer_weights, read_expert_tensor
from paged_core.loading.gguf_packed import load_packed_gguf
from paged_core.loading.loader import ModelSource, forget_gguf_readers, gguf_reader, load_model
from paged_core.quant import Q4_0, Q4_1, Q8_0, QuantizedWeight
from paged_core.runner.packed_experts import PackedExpertsModule, packed_experts_modules

from ..gguf_moe_helpers import dense_moe_oracle, tiny_moe_config, write_tiny_moe_gguf

IDS = torch.tensor([[1, 5, 77, 300, 12, 9, 250, 3, 41, 41, 7]])


def _logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=ids).logits[0]
    return out


def _written(tmp_path: Path, **kwargs: object) -> tuple[Path, object, dict[str, torch.Tensor]]:
    config = tiny_moe_config()
    path = tmp_path / "moe.gguf"
    values = write_tiny_moe_gguf(path, config, **kwargs)  # type: ignore[arg-type]
    return path, config, values


@pytest.mark.parametrize(
    ("experts", "down"),
    [(Q8_0, "same"), (Q4_0, "same"), (Q4_0, Q8_0)],
    ids=["q8_0", "q4_0", "q4_0-gate-up-q8_0-down"],
)
def test_expert_tensors_stay_packed_and_give_the_dequantized_values(
    tmp_path: Path, experts: object, down: object
) -> None:
    path, config, values = _written(tmp_path, expert_format=experts, down_format=down)
    model = load_packed_gguf(path, config, torch.float32).eval()
    mods = dict(packed_experts_modules(model))
    assert sorted(mods) == [f"model.layers.{i}.mlp.experts" for i in range(config.num_hidden_layers)]  # type: ignore[attr-defined]
    want_down = experts if down == "same" else down
    e, inter, hidden = config.num_experts, config.moe_intermediate_size, config.hidden_size  # type: ignore[attr-defined]
    for name, module in mods.items():
        gate_up, down_w = module.weights.gate_up, module.weights.down
        assert isinstance(gate_up, QuantizedWeight) and isinstance(down_w, QuantizedWeight)
        assert (gate_up.format, down_w.format) == (experts, want_down)
        assert gate_up.shape == (e * 2 * inter, hidden) and down_w.shape == (e * hidden, inter)
        # Expert e's gate rows, then its up rows (merged from the file's two tensors), and down as the file holds it.
        prefix = name.removesuffix(".experts")
        torch.testing.assert_close(
            gate_up.dequantize().reshape(e, 2 * inter, hidden), values[f"{prefix}.experts.gate_up_proj"]
        )
        torch.testing.assert_close(down_w.dequantize().reshape(e, hidden, inter), values[f"{prefix}.experts.down_proj"])
    # No float copy of the experts stays alive: the dense parameters transformers allocated are gone.
    assert not [n for n, _ in model.named_parameters() if ".experts." in n]
    torch.testing.assert_close(_logits(model), _logits(dense_moe_oracle(config, values)), rtol=1e-4, atol=1e-4)


def test_down_keeps_the_files_bytes_and_gate_up_interleaves_them(tmp_path: Path) -> None:
    path, config, _ = _written(tmp_path, expert_format=Q4_0)
    model = load_packed_gguf(path, config, torch.float32)
    tensors = {t.name: t for t in gguf_reader(path).tensors}
    module = model.model.layers[1].mlp.experts
    assert isinstance(module, PackedExpertsModule)
    e, inter = config.num_experts, config.moe_intermediate_size  # type: ignore[attr-defined]
    raw = {r: torch.from_numpy(tensors[f"blk.1.ffn_{r}_exps.weight"].data.copy()) for r in ("gate", "up", "down")}
    down = module.weights.down
    assert isinstance(down, QuantizedWeight)
    assert torch.equal(down.data, raw["down"].reshape(down.data.shape))
    gate_up = module.weights.gate_up
    assert isinstance(gate_up, QuantizedWeight)
    per_expert = gate_up.data.reshape(e, 2 * inter, -1)
    assert torch.equal(per_expert[:, :inter], raw["gate"]) and torch.equal(per_expert[:, inter:], raw["up"])
    # Copied out of the file's mapping (the reader is let go after loading).
    assert all(w.data.data_ptr() != t.data.ctypes.data for w, t in ((down, tensors["blk.1.ffn_down_exps.weight"]),))
    forget_gguf_readers()


def test_an_expert_tensor_of_a_format_without_kernels_is_dequantized_the_others_stay_packed(tmp_path: Path) -> None:
    path, config, values = _written(tmp_path, expert_format=Q4_0, down_format="q5_0")
    model = load_packed_gguf(path, config, torch.float32).eval()
    module = model.model.layers[0].mlp.experts
    assert isinstance(module, PackedExpertsModule)
    assert module.weights.kinds == ("q4_0", "float32")
    torch.testing.assert_close(module.weights.down, values["model.layers.0.mlp.experts.down_proj"])  # type: ignore[arg-type]
    torch.testing.assert_close(_logits(model), _logits(dense_moe_oracle(config, values)), rtol=1e-4, atol=1e-4)


def test_float_experts_fill_transformers_parameters(tmp_path: Path) -> None:
    path, config, values = _written(tmp_path, expert_format=None, linear_format=Q4_1)
    model = load_packed_gguf(path, config, torch.float32).eval()
    assert not packed_experts_modules(model)
    torch.testing.assert_close(
        model.model.layers[0].mlp.experts.down_proj.detach(), values["model.layers.0.mlp.experts.down_proj"]
    )
    torch.testing.assert_close(_logits(model), _logits(dense_moe_oracle(config, values)), rtol=1e-4, atol=1e-4)


def test_the_expert_size_comes_from_the_file(tmp_path: Path) -> None:
    from transformers import AutoConfig

    path, config, values = _written(tmp_path, expert_format=Q8_0)
    read = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert read.moe_intermediate_size != config.moe_intermediate_size  # type: ignore[attr-defined]  # transformers' default
    assert read.norm_topk_prob and read.num_experts == 8 and read.num_experts_per_tok == 2
    assert fix_moe_config(gguf_reader(path), read) == [f"moe_intermediate_size={config.moe_intermediate_size}"]  # type: ignore[attr-defined]
    assert fix_moe_config(gguf_reader(path), read) == []
    # load_model completes the config on both routes: packed, and dequantized by transformers (--quantization none).
    source = ModelSource(tmp_path, path.name, "moe")
    want = _logits(dense_moe_oracle(config, values))
    for quantization in ("auto", "none"):
        fresh = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
        model = load_model(source, fresh, torch.float32, torch.device("cpu"), "sdpa", quantization)
        assert bool(packed_experts_modules(model)) == (quantization == "auto")
        torch.testing.assert_close(_logits(model), want, rtol=1e-4, atol=1e-4)


def test_an_expert_tensor_the_config_disagrees_with_is_refused_by_name(tmp_path: Path) -> None:
    path, config, _ = _written(tmp_path, expert_format=Q4_0, break_tensor="blk.1.ffn_up_exps.weight")
    with pytest.raises(
        WeightFormatError,
        match=r"blk\.1\.ffn_up_exps\.weight: shape \[7, 64, 128\] but the config makes these experts \[8, 64, 128\]",
    ):
        load_packed_gguf(path, config, torch.float32)


def test_an_experts_layout_the_contract_does_not_serve_is_refused_naming_the_layer(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path, config, _ = _written(tmp_path, expert_format=Q8_0)
    model = AutoModelForCausalLM.from_config(config)
    module = model.model.layers[0].mlp.experts
    module.is_transposed = True  # as a module storing [E, H, 2I] would say
    tensors = {t.name: t for t in gguf_reader(path).tensors}
    layer = LayerExperts(module)
    for role in ("gate", "up", "down"):
        tensor = tensors[f"blk.0.ffn_{role}_exps.weight"]
        layer.parts[role] = read_expert_tensor(tensor, Q8_0, module, None)
    with pytest.raises(UnsupportedConfigError, match=r"^layer0: .*stores its weights transposed.*--quantization none"):
        layer_weights("layer0", layer, torch.float32)
    forget_gguf_readers()


def test_a_layer_missing_an_expert_tensor_is_refused_by_name(tmp_path: Path) -> None:
    path, config, _ = _written(tmp_path, expert_format=Q8_0, skip_tensor="blk.0.ffn_down_exps.weight")
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.experts: .* no ffn_down_exps for this layer"):
        load_packed_gguf(path, config, torch.float32)
