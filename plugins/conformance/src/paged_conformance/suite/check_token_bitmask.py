"""``FusedOps.apply_token_bitmask`` (structured outputs' mask) against the reference's.

At every declared dtype, on the backend's device: random bitmasks holding words of every kind (all allowed, none
allowed, mixed bits) over SmolLM2's 49,152 tokens, an odd vocabulary, a model vocabulary padded past the
tokenizer's (columns past the mask must become -inf) and a mask wider than the logits; rows in any order and a
subset of the batch. The op writes in place: the masked rows must equal the reference's bit for bit (a mask only
ever writes -inf) and every other row must be untouched. ``-strided`` passes the logits as a column view.
"""

from __future__ import annotations

import pytest
import torch

from paged_conformance.fused import REFERENCE, generator, randn
from paged_conformance.grid import FusedCase
from paged_conformance.session import Conformance

VOCABS: tuple[tuple[int, int], ...] = ((49152, 49152), (1001, 1001), (49280, 49152), (1000, 1100))
"""``(logits' vocabulary, the mask's tokens)``: equal, odd, padded model vocabulary, wider mask."""


def _bitmask(gen: torch.Generator, rows: int, tokens: int) -> torch.Tensor:
    words = (tokens + 31) // 32
    mixed = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    kind = torch.randint(0, 3, (rows, words), generator=gen)
    every, none = torch.full_like(mixed, -1), torch.zeros_like(mixed)
    return torch.where(kind == 0, every, torch.where(kind == 1, none, mixed))


@pytest.mark.paged_capability("structured:token_bitmask")
@pytest.mark.paged_cases("fused")
def test_apply_token_bitmask(conformance: Conformance, fused: FusedCase) -> None:
    ops, gen = conformance.fused_ops(), generator(fused.seed)
    rows = [5, 0, 3]
    for vocab, tokens in VOCABS:
        logits = randn(gen, 7, vocab, scale=4.0).to(conformance.device, fused.dtype)
        if fused.layout == "strided":
            wide = torch.zeros(7, vocab + 64, device=conformance.device, dtype=fused.dtype)
            wide[:, :vocab] = logits
            logits = wide[:, :vocab]
        bitmask = _bitmask(gen, len(rows), tokens)
        want = logits.clone()
        REFERENCE.apply_token_bitmask(want, bitmask, rows)
        got = logits.clone() if fused.layout != "strided" else logits
        ops.apply_token_bitmask(got, bitmask, rows)
        where = f"apply_token_bitmask(logits [7, {vocab}] {fused.id}, bitmask of {tokens} tokens, rows {rows})"
        if not torch.equal(got.cpu(), want.cpu()):
            bad = (got.cpu() != want.cpu()).nonzero()[:3].tolist()
            raise AssertionError(f"{where}: differs from the reference at [row, token] {bad}")
        if fused.layout == "strided" and torch.isinf(wide[:, vocab:]).any():
            raise AssertionError(f"{where}: wrote past the view's columns")
