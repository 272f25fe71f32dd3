"""Driving our engine through a workload step by step, observing what ``LLM.generate`` hides.

The step loop is the engine's own (:meth:`LLMEngine.step`); around it we
time each request's first token and, through :class:`StepProbe`, count the
tokens every step scheduled. Nothing in the engine is changed for this.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm

from paged_bench.result import RunResult, summarize
from paged_bench.workloads import BenchRequest
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.loading.kv_dtype import kv_dtype_name, resolve_kv_dtype
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams
from paged_core.sched.output import SchedulerOutput
from paged_core.sched.scheduler import Scheduler
from paged_core.speculative.proposer import SpecStats
from paged_core.structured import StructuredOutputs

WARMUP = [BenchRequest([100 + i % 997 for i in range(512)], 4), BenchRequest(list(range(200, 232)), 4)]
"""Run before timing: the first steps of each shape pay one-off costs (allocator, kernel set-up), so one long
prefill and a decode batch go first. Their ids share no block with any workload prompt (random ids never
repeat this pattern), and the prefix cache is reset afterwards anyway."""


class StepProbe:
    """Counts scheduled tokens and running requests per step by wrapping one scheduler's ``schedule``.

    The wrapper is an instance attribute, removed by :meth:`close`; the
    scheduler's behaviour is untouched.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.scheduled_tokens = 0
        self.steps = 0
        self.peak_running = 0
        inner: Callable[..., SchedulerOutput] = scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> SchedulerOutput:  # whatever the scheduler takes (``overlap``)
            out = inner(*args, **kwargs)
            self.scheduled_tokens += out.total_num_scheduled_tokens
            self.steps += 1
            self.peak_running = max(self.peak_running, scheduler.num_running)
            return out

        scheduler.schedule = schedule  # type: ignore[method-assign]

    def close(self) -> None:
        """Restore the scheduler's own method."""
        self.scheduler.__dict__.pop("schedule", None)


def _params(r: BenchRequest, constraint: StructuredOutputs | None = None) -> SamplingParams:
    # EOS ignored either way: a constrained request still ends when its grammar does (the core stops it there).
    return SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, structured_outputs=constraint)


def warm_up(engine: LLMEngine, loras: Sequence[LoRARequest] = ()) -> None:
    """Run :data:`WARMUP` to completion (untimed).

    With ``loras``, the long prompt runs on the first adapter and the short one on each: every adapter is
    loaded and put in a slot (as many as fit) before the timed run, and the LoRA kernels see both shapes.
    """
    engine.add_request(WARMUP[0].prompt_token_ids, _params(WARMUP[0]), lora_request=loras[0] if loras else None)
    short: Sequence[LoRARequest | None] = loras or [None]
    for lora in short:
        engine.add_request(WARMUP[1].prompt_token_ids, _params(WARMUP[1]), lora_request=lora)
    while engine.has_unfinished_requests():
        engine.step()
    engine.core.scheduler.reset_prefix_cache()


def warm_up_constrained(engine: LLMEngine, constraint: StructuredOutputs) -> None:
    """One short constrained request to completion (untimed): builds the core's grammar compiler (wrapping the
    tokenizer takes about a second, once per engine) and the first masked steps' buffers."""
    r = WARMUP[1]
    engine.add_request(r.prompt_token_ids, _params(r, constraint))
    while engine.has_unfinished_requests():
        engine.step()
    engine.core.scheduler.reset_prefix_cache()


def run_engine(
    engine: LLMEngine,
    requests: Sequence[BenchRequest],
    name: str,
    progress: bool = True,
    constraints: Sequence[StructuredOutputs] | None = None,
    loras: Sequence[LoRARequest | None] | None = None,
) -> RunResult:
    """Submit every request at once, step until all finish, and measure (greedy, EOS ignored).

    With ``constraints`` (one per request) every request is constrained: it ends when its grammar does, so
    the run's output tokens are those produced, and its ``structured`` figures say how (see
    :func:`grammar_figures`). With ``loras`` (one per request, ``None``: the base model) each request runs on
    its adapter.
    """
    if engine.has_unfinished_requests():
        raise RuntimeError(f"{name}: the engine still has requests in flight; benchmarks need it idle")
    if constraints is not None and len(constraints) != len(requests):
        raise ValueError(f"{name}: {len(constraints)} constraints for {len(requests)} requests")
    if loras is not None and len(loras) != len(requests):
        raise ValueError(f"{name}: {len(loras)} adapters for {len(requests)} requests")
    grammar0 = _grammar_counts(engine)
    finish: dict[str, int] = {}
    valid_json = 0
    lengths = [0] * len(requests)
    kv = engine.core.scheduler.kv
    queries0, hits0 = kv.stats.queries, kv.stats.hits
    preempt0 = engine.core.scheduler.num_preemptions
    spec0 = dataclasses.replace(engine.core.spec_stats)
    probe = StepProbe(engine.core.scheduler)
    n = len(requests)
    first: list[float | None] = [None] * n
    emitted: list[tuple[float, int]] = []  # (time, tokens produced) per step
    try:
        start = time.perf_counter()
        index = {
            engine.add_request(
                r.prompt_token_ids,
                _params(r, constraints[i] if constraints else None),
                lora_request=loras[i] if loras else None,
            ): i
            for i, r in enumerate(requests)
        }
        done = 0
        with tqdm(total=n, desc=name, unit="req", disable=not progress) as bar:
            while done < n:
                outs = engine.step()
                now = time.perf_counter()
                produced = 0
                for out in outs:
                    i = index.get(out.request_id)
                    if i is None:
                        continue
                    new = sum(len(c.new_token_ids) for c in out.outputs)
                    produced += new
                    lengths[i] += new
                    if first[i] is None and any(c.token_ids for c in out.outputs):
                        first[i] = now - start
                    if out.finished:
                        done += 1
                        bar.update(1)
                        for c in out.outputs:
                            finish[c.finish_reason or "unknown"] = finish.get(c.finish_reason or "unknown", 0) + 1
                            valid_json += constraints is not None and _is_json(c.text)
                emitted.append((now - start, produced))
        seconds = time.perf_counter() - start
    finally:
        probe.close()
    # Unconstrained, every request makes exactly max_tokens (EOS ignored); constrained ones stop early.
    output_tokens = sum(k for _, k in emitted) if constraints is not None else sum(r.max_tokens for r in requests)
    ttft = [t for t in first if t is not None]
    now_spec = engine.core.spec_stats
    spec = SpecStats(
        now_spec.verify_rows - spec0.verify_rows,
        now_spec.draft_tokens - spec0.draft_tokens,
        now_spec.accepted_tokens - spec0.accepted_tokens,
    )
    queries = kv.stats.queries - queries0
    return RunResult(
        name=name,
        seconds=seconds,
        num_requests=n,
        prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
        output_tokens=output_tokens,
        ttft=ttft if len(ttft) == n else None,
        # Every scheduled token is either a prompt token or a fed-back output token (all but the last), or a
        # draft: kept drafts are output tokens never fed back again, rejected ones were scheduled for nothing.
        prefill_tokens_computed=probe.scheduled_tokens - (output_tokens - n) - spec.draft_tokens + spec.accepted_tokens,
        prefix_hit_rate=(kv.stats.hits - hits0) / queries if kv.enable_caching and queries else None,
        decode_tok_s=decode_rate(emitted, max(ttft, default=0.0)),
        steps=probe.steps,
        peak_running=probe.peak_running,
        preemptions=engine.core.scheduler.num_preemptions - preempt0,
        spec_acceptance_rate=spec.acceptance_rate if spec.verify_rows else None,
        spec_mean_accepted_length=spec.mean_accepted_length if spec.verify_rows else None,
        structured=grammar_figures(grammar0, _grammar_counts(engine), finish, valid_json, lengths)
        if constraints is not None
        else None,
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _grammar_counts(engine: LLMEngine) -> tuple[int, int, float, list[float]]:
    """The core's mask figures so far: masked steps, rows, seconds, and every compile time."""
    stats = engine.core.grammars.stats
    return stats.steps, stats.rows, stats.seconds, list(stats.compile_s)


def grammar_figures(
    before: tuple[int, int, float, list[float]],
    after: tuple[int, int, float, list[float]],
    finish: dict[str, int],
    valid_json: int,
    lengths: Sequence[int],
) -> dict[str, Any]:
    """A constrained run's figures from the engine's grammar stats: masked steps (mean seconds a step and
    mean constrained rows a step), compile p50/p99, how the requests finished, how many parsed as JSON, and
    each request's output length."""
    steps, rows, seconds = (after[i] - before[i] for i in range(3))  # type: ignore[operator]
    compiles = after[3][len(before[3]) :]
    return {
        "mask_steps": steps,
        "mask_rows": rows,
        "mask_seconds": seconds,
        "mask_s_per_step": seconds / steps if steps else None,
        "rows_per_step": rows / steps if steps else None,
        "compiles": len(compiles),
        "compile_s": summarize(compiles) if compiles else None,
        "finish_reasons": dict(sorted(finish.items())),
        "valid_json": valid_json,
        "output_lens": list(lengths),
    }


def decode_rate(emitted: Sequence[tuple[float, int]], start: float) -> float | None:
    """Tokens per second produced after ``start`` (when every request had its first token)."""
    after = [(t, k) for t, k in emitted if t > start]
    if not after:
        return None
    span = after[-1][0] - start
    return sum(k for _, k in after) / span if span > 0 else None


def engine_config_summary(engine: LLMEngine) -> dict[str, Any]:
    """The engine settings a figure depends on, for the report."""
    s, kv = engine.core.scheduler.config, engine.core.scheduler.kv
    return {
        "backend": engine.loaded.backend.name,
        "dtype": str(engine.loaded.dtype).removeprefix("torch."),
        "kv_cache_dtype": kv_dtype_name(resolve_kv_dtype(engine.config.cache.kv_cache_dtype, engine.loaded.dtype)),
        "block_size": kv.block_size,
        "num_kv_blocks": kv.pool.num_usable_blocks,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "enable_prefix_caching": kv.config.enable_prefix_caching,
        "enable_chunked_prefill": s.enable_chunked_prefill,
        "max_model_len": engine.core.scheduler.max_len,
        "model_path": engine.core.runner.forward_impl.name,
        "graph_mode": engine.core.runner.graph_mode,
        "batch_invariant": engine.facts.batch_invariant,
        "runtime": _runtime(),
    }


def _runtime() -> dict[str, Any]:
    """The allocator and OpenMP library in effect (see :mod:`paged_core.process.runtime`)."""
    from paged_core.process.runtime import runtime_status

    return dict(runtime_status())
