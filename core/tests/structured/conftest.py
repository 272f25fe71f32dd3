"""One tokenizer (the embedded SmolLM2's) and one compiler for the module: wrapping the tokenizer costs ~1.5 s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from paged_core.structured import GrammarCompiler

from .helpers import PADDED_VOCAB


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from paged_core.loading.loader import load_tokenizer, resolve_source

    return load_tokenizer(resolve_source(None))


@pytest.fixture(scope="session")
def compiler(tokenizer: Any) -> Iterator[GrammarCompiler]:
    with GrammarCompiler(tokenizer, vocab_size=PADDED_VOCAB, timeout_s=30.0) as c:
        yield c
