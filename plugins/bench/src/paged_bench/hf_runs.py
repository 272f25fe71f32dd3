"""The transformers baselines, run on the very weights our engine loaded (same dtype, same device).

``hf-static``: ``model.generate`` over static, left-padded batches, each
generating as many tokens as its longest request asks for. ``hf-cb``:
transformers' continuous batching, through the manager ``generate_batch``
is built on (``generate_batch`` itself takes one ``max_new_tokens`` for all
requests; the manager takes it per request, which the workloads need). Its
paged cache gets the same KV budget and per-step token budget as ours.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from tqdm.auto import tqdm

from paged_bench.result import RunResult
from paged_bench.workloads import BenchRequest

HF_CB_PAGE_SIZE = 256
"""Tokens per block in transformers' continuous-batching cache (its default)."""


@contextmanager
def attention(model: Any, implementation: str) -> Iterator[None]:
    """Run ``model`` with another attention implementation, restoring ours afterwards."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = implementation
    try:
        yield
    finally:
        model.config._attn_implementation = saved


def _counts(requests: Sequence[BenchRequest]) -> tuple[int, int]:
    return sum(len(r.prompt_token_ids) for r in requests), sum(r.max_tokens for r in requests)


def _pad_id(model: Any) -> int:
    pad = getattr(model.generation_config, "pad_token_id", None)
    return pad if isinstance(pad, int) else 0


def run_hf_static(model: Any, requests: Sequence[BenchRequest], batch_size: int, progress: bool = True) -> RunResult:
    """transformers ``generate`` (sdpa) over batches of ``batch_size`` requests in workload order."""
    if batch_size < 1:
        raise ValueError(f"hf-static batch size must be >= 1, got {batch_size}")
    pad = _pad_id(model)
    device = model.device
    chunks = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    first = _FirstToken()
    with attention(model, "sdpa"), torch.inference_mode(), count_experts_calls(model) as calls:
        _generate(model, [BenchRequest(list(range(100, 116)), 2)], pad, device)  # warm-up
        calls.clear()
        start = time.perf_counter()
        for chunk in tqdm(chunks, desc="hf-static", unit="batch", disable=not progress):
            _generate(model, chunk, pad, device, first if len(chunks) == 1 else None)
        seconds = time.perf_counter() - start
    prompt, output = _counts(requests)
    result = RunResult("hf-static", seconds, len(requests), prompt, output, experts_calls=calls.total())
    if first.at is not None:  # one batch: its first token is every request's, so the rest is pure decode
        result.ttft = [first.at - start] * len(requests)
        span = start + seconds - first.at
        result.decode_tok_s = (output - len(requests)) / span if span > 0 and output > len(requests) else None
    return result


class _FirstToken:
    """A ``generate`` streamer noting when the first generated token came (its first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


class _ExpertsCalls(dict[str, int]):
    """Forward calls of each routed-experts module while counting."""

    enabled = False
    """Whether the model has routed experts at all."""

    def total(self) -> int | None:
        """Calls in all (``None``: the model has no routed experts)."""
        return sum(self.values()) if self.enabled else None


@contextmanager
def count_experts_calls(model: Any) -> Iterator[_ExpertsCalls]:
    """Count forward calls of ``model``'s routed-experts modules (transformers' own, or paged's packed ones):
    proof that a baseline ran the model's experts, and through which module."""
    from paged_core.runner.experts import experts_modules
    from paged_core.runner.packed_experts import packed_experts_modules

    calls = _ExpertsCalls()
    found = dict(experts_modules(model))
    found.update(packed_experts_modules(model))
    calls.enabled = bool(found)
    handles = []
    for name, module in found.items():

        def hook(*_: Any, key: str = name) -> None:
            calls[key] = calls.get(key, 0) + 1

        handles.append(module.register_forward_hook(hook))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _generate(
    model: Any, chunk: Sequence[BenchRequest], pad: int, device: torch.device, streamer: Any | None = None
) -> None:
    width = max(len(r.prompt_token_ids) for r in chunk)
    ids = torch.tensor([[pad] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in chunk], device=device)
    mask = torch.tensor(
        [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in chunk], device=device
    )
    new = max(r.max_tokens for r in chunk)
    # eos_token_id=None: every row runs to max_new_tokens (EOS ignored, as in our runs).
    model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad,
        streamer=streamer,
    )


def kv_bytes_per_token(model: Any) -> int:
    """K and V bytes one token costs across all layers (for sizing transformers' cache like ours)."""
    cfg = model.config.get_text_config()
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * model.dtype.itemsize  # type: ignore[no-any-return]


def run_hf_cb(
    model: Any,
    requests: Sequence[BenchRequest],
    kv_cache_bytes: int,
    max_batch_tokens: int,
    progress: bool = True,
) -> RunResult:
    """transformers continuous batching (sdpa), every request queued at once, EOS disabled."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    num_blocks = max(2, kv_cache_bytes // (HF_CB_PAGE_SIZE * kv_bytes_per_token(model)))
    cb = ContinuousBatchingConfig(page_size=HF_CB_PAGE_SIZE, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=_pad_id(model))  # type: ignore[no-untyped-call]
    with (
        attention(model, "sdpa"),
        model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
        ) as manager,
    ):
        _collect(manager, [BenchRequest(list(range(100, 116)), 2)], None)  # warm-up
        start = time.perf_counter()
        _collect(manager, requests, tqdm(total=len(requests), desc="hf-cb", unit="req", disable=not progress))
        seconds = time.perf_counter() - start
    prompt, output = _counts(requests)
    return RunResult("hf-cb", seconds, len(requests), prompt, output)


def _collect(manager: Any, requests: Sequence[BenchRequest], bar: Any | None) -> None:
    pending = set()
    for r in requests:
        rid = manager.add_request(r.prompt_token_ids, max_new_tokens=r.max_tokens, eos_token_id=-1)
        if rid is None:
            raise RuntimeError("hf-cb: transformers' continuous-batching manager refused a request")
        pending.add(rid)
    while pending:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("hf-cb: transformers' continuous-batching loop stopped with requests pending")
            continue
        if result.is_finished() and result.request_id in pending:
            if result.error is not None:
                raise RuntimeError(f"hf-cb: request failed in transformers: {result.error}")
            pending.discard(result.request_id)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
