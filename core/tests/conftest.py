"""A tiny engine for engine tests: a 2-layer Llama with random weights and a byte-level tokenizer (260 ids)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .engine_helpers import BOS, EOS, VOCAB


def _byte_tokenizer() -> Any:
    """Every byte is one token, so any text round-trips and stop strings can be produced token by token."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    vocab = {c: i for i, c in enumerate(alphabet)} | {"<s>": BOS, "</s>": EOS}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("engine-model") / "tiny-bytes"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    _byte_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> Any:
    """Weights and tokenizer loaded once; :func:`make_engine` wraps them in fresh engines.

    On the C++ CPU backend when it is installed (many times faster per step), else the pure-torch reference.
    """
    from paged_core.engine_config import EngineConfig
    from paged_core.loading.build import load
    from paged_core.registry import load_registry

    names = {r.name for r in load_registry().records() if r.selectable}
    backend = "cpu" if "cpu" in names else "reference"
    return load(EngineConfig.of(model=str(tiny_model_dir), backend=backend, kv_cache_memory="1MiB"))
