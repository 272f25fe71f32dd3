"""LoRA over packed base weights (a QLoRA fine-tune of a GGUF base): the embedded SmolLM2 served from its Q4_1 GGUF,
packed, with an adapter, equals transformers + PEFT on the same weights dequantized to fp32, token for token."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from paged_core import LLM, LoRARequest

from .e2e_helpers import GREEDY, assert_same_tokens
from .lora_helpers import peft_greedy, save_adapter

pytestmark = pytest.mark.usefixtures("exact_activations")  # parity with the dequantized model: fp32 activations


def test_an_adapter_over_packed_weights_matches_peft_on_the_dequantized_model(
    smol_base: LLM, prompts32: list[list[int]], tmp_path: Path
) -> None:
    assert smol_base.engine.loaded.source.gguf_file, "the embedded model is served from its GGUF"
    dense = LLM(backend="reference", dtype="float32", kv_cache_memory="64MiB", quantization="none")
    dense_dir = tmp_path / "dense"
    _save_dense(dense.engine.loaded.model, dense_dir)
    dense.close()
    spec = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    adapter = save_adapter(dense_dir, "smol-lora", spec, tmp_path, seed=5, scale=0.05)
    prompts = prompts32[:4]
    params = dataclasses.replace(GREEDY, max_tokens=8)
    want = peft_greedy(dense_dir, adapter, prompts, params.max_tokens)
    base = peft_greedy(dense_dir, None, prompts, params.max_tokens)
    assert want != base  # the adapter matters
    llm = smol_base.reconfigured(enable_lora=True)
    lora = LoRARequest("smol-lora", 1, str(adapter))
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=[lora, None, lora, None])
    assert_same_tokens(outs, [want[0], base[1], want[2], base[3]])


def _save_dense(model: Any, out: Path) -> None:
    """A transformers checkpoint of a model loaded from GGUF (which ``save_pretrained`` refuses: its config names
    the GGUF quantization), with the weights as they are now (dequantized, fp32)."""
    from safetensors.torch import save_file

    out.mkdir()
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    # The fused decoder made q/k/v (and gate/up) views of merged tensors: each is saved as a copy of its own.
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"))
