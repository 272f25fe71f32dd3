"""Matchers: all-or-nothing accept, draft validation and rollback, fork; batch masks equal single ones; the apply."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paged_core.structured import (
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutputs,
    allocate_bitmask,
    apply_bitmask,
    fill_bitmask,
)

from .helpers import PADDED_VOCAB

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def json_matcher(compiler: GrammarCompiler) -> Any:
    compiled = compiler.compile(StructuredOutputs(json=SCHEMA))
    return compiled.matcher


def _mask(matcher: GrammarMatcher) -> torch.Tensor:
    bitmask = allocate_bitmask(1, PADDED_VOCAB)
    matcher.fill(bitmask, 0)
    return bitmask[0].clone()


def test_accept_is_all_or_nothing(json_matcher: Any, tokenizer: Any) -> None:
    matcher = json_matcher()
    before = _mask(matcher)
    assert not matcher.accept(tokenizer.encode('{"name": "x", "wrong"'))
    assert torch.equal(_mask(matcher), before), "a refused accept left tokens consumed"
    assert matcher.accept(tokenizer.encode('{"name": "x", "n": 4'))
    assert not matcher.is_accepting() and not matcher.is_terminated()
    assert matcher.accept(tokenizer.encode("}"))
    assert matcher.is_terminated(), "a closed object ends the output: nothing may follow"


def test_end_token_ends_an_open_ended_grammar(compiler: GrammarCompiler, tokenizer: Any) -> None:
    matcher = compiler.compile(StructuredOutputs(regex="[0-9]+")).matcher()
    assert matcher.accept(tokenizer.encode("12"))
    assert matcher.is_accepting() and not matcher.is_terminated()
    assert matcher.accept([tokenizer.eos_token_id]) and matcher.is_terminated()


def test_validate_and_rollback_a_draft(json_matcher: Any, tokenizer: Any) -> None:
    matcher = json_matcher()
    assert matcher.accept(tokenizer.encode('{"name": '))
    state = _mask(matcher)
    good, bad = tokenizer.encode('"ab", "n"'), tokenizer.encode("}")
    assert matcher.validate(good + bad) == len(good)
    assert torch.equal(_mask(matcher), state), "validate consumed tokens"
    assert matcher.accept(good)
    matcher.rollback(len(good))
    assert torch.equal(_mask(matcher), state)
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(100)


def test_fork_is_independent(json_matcher: Any, tokenizer: Any) -> None:
    matcher = json_matcher()
    assert matcher.accept(tokenizer.encode('{"name": "a'))
    fork = matcher.fork()
    assert torch.equal(_mask(fork), _mask(matcher))
    assert fork.accept(tokenizer.encode('", "n": 1}'))
    assert fork.is_accepting() and not matcher.is_accepting()
    assert matcher.accept(tokenizer.encode('bc", "n": 22}'))


def test_32_rows_equal_32_single_fills(compiler: GrammarCompiler, tokenizer: Any) -> None:
    specs = [
        StructuredOutputs(json=SCHEMA),
        StructuredOutputs(json_object=True),
        StructuredOutputs(regex=r"\d{2}-[a-z]+"),
        StructuredOutputs(choice=["alpha", "beta", "gamma"]),
    ]
    prefixes = ['{"name": "', "{", "4", "be", '{"name": "q", ', '{"x": [1', "12-", ""]
    compiled = [compiler.compile(s) for s in specs]
    matchers = []
    for i in range(32):
        matcher = compiled[i % len(specs)].matcher()
        text = prefixes[i % len(prefixes)]
        matcher.accept(tokenizer.encode(text)) if text else None  # a refused prefix leaves the start state
        matchers.append(matcher)
    batch = allocate_bitmask(32, PADDED_VOCAB)
    fill_bitmask(matchers, batch)
    singles = torch.stack([_mask(m) for m in matchers])
    assert torch.equal(batch, singles)
    assert len({tuple(row.tolist()) for row in singles}) > 4, "the rows should differ"


def _reference_apply(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    bits = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(bitmask.shape[0], -1)
    for i, row in enumerate(rows):
        keep = torch.zeros(logits.shape[1], dtype=torch.bool)
        width = min(logits.shape[1], bits.shape[1])
        keep[:width] = bits[i, :width].bool()
        out[row].masked_fill_(~keep, float("-inf"))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [100, 96, 130])
def test_apply_bitmask_matches_a_masked_fill(dtype: torch.dtype, vocab: int) -> None:
    """Random masks over 100 ids (bitmask 4 words = 128 ids), applied to logits 100, 96 and 130 wide."""
    gen = torch.Generator().manual_seed(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=gen)
    logits = torch.randn(6, vocab, generator=gen).to(dtype)
    rows = [4, 0, 2]
    expected = _reference_apply(logits, bitmask, rows)
    apply_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[[1, 3, 5]]).sum() == 0, "an unconstrained row was touched"
