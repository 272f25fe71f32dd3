"""Assertions shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import torch

from paged_bench.hf_runs import attention
from paged_core import LLM, RequestOutput, SamplingParams


def assert_same_tokens(outputs: list[RequestOutput], expected: list[list[int]]) -> None:
    """Every request's first completion equals the expected ids; the message shows where they part."""
    assert len(outputs) == len(expected)
    for i, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        assert out.error is None, out.error
        got = out.outputs[0].token_ids
        if got != want:
            k = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            raise AssertionError(
                f"prompt {i}: tokens differ from position {k}: got {got[k : k + 5]}, want {want[k : k + 5]}"
            )


def hf_greedy(llm: LLM, prompts: list[list[int]], max_new_tokens: int, attn: str = "sdpa") -> list[list[int]]:
    """transformers' own ``generate`` (no paging) on the same weights, one prompt at a time.

    ``attn`` is transformers' attention ("eager" for models whose soft cap sdpa refuses).
    """
    model = llm.engine.loaded.model
    outs = []
    with attention(model, attn), torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def mixed_prompts(tokenizer: Any, count: int, seed: int = 0, longest: int = 300) -> list[list[int]]:
    """``count`` prompts of varied lengths (4..``longest`` tokens) cut from natural text."""
    text = (
        "The history of paged memory begins with virtual memory systems in the 1960s, where fixed-size pages let "
        "an operating system place a process's memory anywhere in physical RAM. Large language model serving "
        "borrowed the idea: the key and value cache of each request is split into blocks, and a block table maps "
        "logical positions to physical blocks. This removes fragmentation and lets requests share prefixes. "
        "Meanwhile, in the kitchen, a cook prepares bread with flour, water, salt and yeast, kneading the dough "
        "until it is smooth, then letting it rise twice before baking it in a hot oven. Rivers carve valleys over "
        "millions of years; mountains rise where plates collide; weather follows the sun's uneven heating. "
    ) * 4
    ids = tokenizer.encode(text)
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        n = rng.randint(4, longest)
        start = rng.randint(0, len(ids) - n)
        prompts.append(ids[start : start + n])
    return prompts


ACTIVATIONS_ENV = "PAGED_CPU_LINEAR_ACTIVATIONS"


def cpu_linear_activations_mode() -> str | None:
    """The cpu backend's packed-linear activations now (``None`` without the cpu backend)."""
    try:
        from paged_backend_cpu import ops
    except ImportError:
        return None
    return ops.linear_activations()


@contextlib.contextmanager
def cpu_linear_activations(mode: str) -> Iterator[bool]:
    """The cpu backend's packed-linear activations set to ``mode`` here and in engine processes started meanwhile
    (yields whether the cpu backend is installed; without it, nothing to set)."""
    try:
        from paged_backend_cpu import ops
    except ImportError:
        yield False
        return
    before, before_env = ops.linear_activations(), os.environ.get(ACTIVATIONS_ENV)
    ops.set_linear_activations(mode)
    os.environ[ACTIVATIONS_ENV] = mode
    try:
        yield True
    finally:
        ops.set_linear_activations(before)
        if before_env is None:
            os.environ.pop(ACTIVATIONS_ENV, None)
        else:
            os.environ[ACTIVATIONS_ENV] = before_env
