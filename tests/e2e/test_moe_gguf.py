"""A GGUF MoE file served with its expert blocks packed: the fused decoder and transformers' modules against the
same file dequantized by transformers (fp32), token for token and by the NLL of a fixed text.

The file is a tiny random Qwen3-MoE (``qwen3moe``: two layers, eight experts, two per token, renormalised) with
Q4_0 gate/up and Q8_0 down expert tensors and Q8_0 attention and head, written as llama.cpp lays it out
(core/tests/gguf_moe_helpers.py). Target: NLL within 0.5% of the dequantized model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from paged_bench.nll import engine_nll, transformers_nll
from paged_core import LLM
from paged_core.loading.gguf_experts import fix_moe_config
from paged_core.loading.loader import forget_gguf_readers, gguf_reader
from paged_core.quant import Q4_0, Q8_0, QuantizedWeight
from paged_core.runner.fused import FusedDecoder
from paged_core.runner.packed_experts import PackedExpertsModule

from .conftest import VARIANTS, fast_backend
from .e2e_helpers import GREEDY, assert_same_tokens, cpu_linear_activations

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity: fp32 activations unless a test asks for int8

ROOT = Path(__file__).resolve().parents[2]
LICENSE = ROOT / "LICENSE"


def _helpers() -> ModuleType:
    """core/tests/gguf_moe_helpers.py (the GGUF writer the loading tests use), loaded by path."""
    spec = importlib.util.spec_from_file_location("gguf_moe_helpers", ROOT / "core" / "tests" / "gguf_moe_helpers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, Any]:
    """Our engine on the file (packed experts), and transformers' model of the same file dequantized."""
    from transformers import AutoConfig, AutoModelForCausalLM

    helpers = _helpers()
    directory = tmp_path_factory.mktemp("moe-gguf")
    path = directory / "tiny-qwen3-moe.gguf"
    helpers.write_tiny_moe_gguf(path, helpers.tiny_moe_config(), Q4_0, Q8_0, down_format=Q8_0)
    llm = LLM(str(path), backend=fast_backend(), dtype="float32", num_blocks=160, block_size=16)
    config = AutoConfig.from_pretrained(str(directory), gguf_file=path.name)
    fix_moe_config(gguf_reader(path), config)  # the expert size transformers does not read
    forget_gguf_readers()
    dense = AutoModelForCausalLM.from_pretrained(
        str(directory), gguf_file=path.name, config=config, dtype=torch.float32
    )
    return llm, dense.eval()


def _greedy(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False, pad_token_id=0
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


def test_the_fused_decoder_routes_the_files_packed_experts(moe_gguf: tuple[LLM, Any]) -> None:
    llm, _ = moe_gguf
    model = llm.engine.loaded.model
    decoder = llm.engine.core.runner.forward_impl
    assert isinstance(decoder, FusedDecoder)
    for i, layer in enumerate(decoder.layers):
        module = model.model.layers[i].mlp.experts
        assert isinstance(module, PackedExpertsModule) and layer.moe is not None
        assert layer.moe.experts.kinds == ("q4_0", "q8_0")
        gate_up = layer.moe.experts.gate_up
        # The backend's experts read the module's packed rows (a view), not a copy, unless its packing made one.
        if layer.moe.experts.packed is None:
            assert isinstance(gate_up, QuantizedWeight) and isinstance(module.weights.gate_up, QuantizedWeight)
            assert gate_up.data.data_ptr() == module.weights.gate_up.data.data_ptr()
    assert not [n for n, _ in model.named_parameters() if ".experts." in n]


@pytest.mark.parametrize("variant", ["fused-eager", "transformers-eager"])
def test_greedy_equals_the_dequantized_model(moe_gguf: tuple[LLM, Any], variant: str) -> None:
    base, dense = moe_gguf
    llm = base.reconfigured(**VARIANTS[variant])
    assert llm.engine.core.runner.forward_impl.name == VARIANTS[variant]["model_impl"]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 320, (n,), generator=gen).tolist() for n in (3, 17, 40, 95, 160)]
    want = _greedy(dense, prompts, GREEDY.max_tokens)
    assert_same_tokens(llm.generate(prompts, GREEDY, use_tqdm=False), want)


def test_nll_of_a_fixed_text_is_within_half_a_percent_of_the_dequantized_model(moe_gguf: tuple[LLM, Any]) -> None:
    llm, dense = moe_gguf
    ids = llm.tokenizer.encode(" ".join(LICENSE.read_text().split()))[:1024]
    assert len(ids) == 1024
    theirs = transformers_nll(dense, ids)
    ours = engine_nll(llm, ids)
    # The cpu backend's default activations for its packed linears (int8, two levels), as a user runs it.
    with cpu_linear_activations("int8x2"):
        ours_default = engine_nll(llm, ids)
        ours_decoding = engine_nll(llm, ids[:256], chunk=1)
    assert abs(ours - theirs) / theirs < 0.005, (ours, theirs)
    assert abs(ours_default - theirs) / theirs < 0.005, (ours_default, theirs)
    theirs_256 = transformers_nll(dense, ids[:256])
    assert abs(ours_decoding - theirs_256) / theirs_256 < 0.005, (ours_decoding, theirs_256)
