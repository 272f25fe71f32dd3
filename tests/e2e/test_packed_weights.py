"""Packed weights end to end: the embedded Q4_1 GGUF served as it is, and int8 weight-only made at load.

The embedded model's NLL over a fixed English text (the repository's LICENSE, its first 1,024 tokens) through
our engine, with the GGUF blocks read by the backend's kernels, must be within 0.5% of transformers on
the same GGUF dequantized to fp32 (measured: identical to 1e-7 on the reference ops).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paged_bench.nll import engine_nll, transformers_nll
from paged_core import LLM
from paged_core.runner.packed_linear import PackedLinearModule, packed_modules

from .e2e_helpers import GREEDY, assert_same_tokens, cpu_linear_activations, hf_greedy

pytestmark = pytest.mark.usefixtures("exact_activations")  # NLL and parity: fp32 unless a test asks for int8

LICENSE = Path(__file__).resolve().parents[2] / "LICENSE"


def test_the_embedded_gguf_is_served_packed_by_the_backend(smol_base: LLM) -> None:
    model = smol_base.engine.loaded.model
    mods = dict(packed_modules(model))
    assert len(mods) == 30 * 7 + 1  # every projection, and the LM head tied to the Q8_0 embedding
    assert {m.qweight.format.name for m in mods.values()} == {"q4_1", "q8_0"}
    ops = smol_base.engine.loaded.backend.fused_ops()
    if smol_base.engine.loaded.backend.name == "cpu":  # the backend's own kernels, not the reference fallback
        assert {"q4_1", "q8_0"} <= type(ops).linear_formats
        assert all(m.packed.packed is not None for m in mods.values())
    decoder = smol_base.engine.core.runner.forward_impl
    if decoder.name == "fused":  # merged q/k/v and gate/up share the modules' bytes (views, no copies)
        layer = decoder.layers[0]
        assert layer.qkv.weight.data.data_ptr() == model.model.layers[0].self_attn.q_proj.qweight.data.data_ptr()


def test_nll_of_a_fixed_text_is_within_half_a_percent_of_the_dequantized_model(smol_base: LLM) -> None:
    from transformers import AutoModelForCausalLM

    # The text's first 1,024 tokens (the whole LICENSE, 2,224, doubles the test's minute of compute and measured
    # the same: `paged bench throughput --kv-dtypes auto` scores the whole text).
    ids = smol_base.tokenizer.encode(LICENSE.read_text())[:1024]
    assert len(ids) == 1024
    ours = engine_nll(smol_base, ids)
    # The cpu backend's default activations (int8, two levels; conftest keeps them exact for the parity tests),
    # one rule at every row count: in chunks of 256 (prefill tiles) and one token per forward, as decoding runs.
    with cpu_linear_activations("int8x2"):
        ours_int8 = engine_nll(smol_base, ids)
        ours_decoding = engine_nll(smol_base, ids[:512], chunk=1)
    src = smol_base.engine.loaded.source
    dense = AutoModelForCausalLM.from_pretrained(str(src.directory), gguf_file=src.gguf_file, dtype=torch.float32)
    theirs = transformers_nll(dense.eval(), ids)
    assert abs(ours - theirs) / theirs < 0.005, (ours, theirs)
    assert abs(ours_int8 - theirs) / theirs < 0.005, (ours_int8, theirs)
    theirs_half = transformers_nll(dense, ids[:512])
    assert abs(ours_decoding - theirs_half) / theirs_half < 0.005, (ours_decoding, theirs_half)


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, Path]:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from .conftest import fast_backend

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=384,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("int8") / "tiny"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    llm = LLM(str(path), quantization="int8", backend=fast_backend(), dtype="float32", num_blocks=64, block_size=16)
    return llm, path


def test_int8_packs_every_linear_and_decodes_like_transformers_on_it(tiny_int8: tuple[LLM, Path]) -> None:
    llm, _ = tiny_int8
    mods = packed_modules(llm.engine.loaded.model)
    assert len(mods) == 2 * 7 + 1 and {m.qweight.format.name for _, m in mods} == {"int8"}
    prompts = [[1, 5, 9, 200, 17], [3] * 40, list(range(4, 100))]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_tokens(outs, hf_greedy(llm, prompts, GREEDY.max_tokens))


def test_int8_stays_close_to_the_float_weights(tiny_int8: tuple[LLM, Path]) -> None:
    from transformers import AutoModelForCausalLM

    llm, path = tiny_int8
    dense = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = [int(i) for i in torch.randint(3, 380, (200,), generator=torch.Generator().manual_seed(1))]
    ours, theirs = engine_nll(llm, ids), transformers_nll(dense, ids)
    assert abs(ours - theirs) / theirs < 0.01, (ours, theirs)
    head = llm.engine.loaded.model.lm_head
    assert isinstance(head, PackedLinearModule)
