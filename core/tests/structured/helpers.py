"""Walking a grammar by its masks, for the structured-output tests."""

from __future__ import annotations

import torch

from paged_core.structured import GrammarCompiler, GrammarMatcher, StructuredOutputs, allocate_bitmask

PADDED_VOCAB = 49152 + 64
"""The model's vocabulary padded past the tokenizer's 49,152 ids, as many checkpoints pad it."""


def allowed(bitmask_row: torch.Tensor) -> torch.Tensor:
    """The token ids a bitmask row allows, ascending."""
    bits = (bitmask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return torch.nonzero(bits.flatten()).flatten()


def greedy_walk(compiler: GrammarCompiler, spec: StructuredOutputs, max_steps: int = 400) -> list[int]:
    """Tokens chosen as the highest allowed id at each step, until the grammar ends the output."""
    matcher: GrammarMatcher = compiler.compile(spec).matcher()
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    tokens: list[int] = []
    for _ in range(max_steps):
        matcher.fill(bitmask, 0)
        token = int(allowed(bitmask[0])[-1])
        assert matcher.accept([token])
        tokens.append(token)
        if matcher.is_terminated():
            return tokens
    raise AssertionError(f"no end after {max_steps} tokens: {tokens[-10:]}")
