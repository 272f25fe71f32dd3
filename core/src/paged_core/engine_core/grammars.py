"""Structured outputs inside the core: compiles in flight, and each step's token masks.

A request with ``structured_outputs`` waits here, out of the scheduler, while its grammar compiles on
the :class:`~paged_core.structured.GrammarCompiler`'s pool (built on the first such request, so an
engine without constraints pays nothing); :meth:`Grammars.ready` hands over the finished compiles at
the start of each step, and a compile error or timeout fails that request alone. During a step the
sampled consumer masks its constrained rows through :meth:`Grammars.mask` (one bitmask filled from
the rows' matchers, applied by the backend's ``FusedOps.apply_token_bitmask``), and draft verification
through :meth:`Grammars.mask_drafts` (a mask per verify row, the matcher advanced along the draft's
grammar-valid prefix, then rolled back).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait

import torch

from paged_core.engine_core.messages import GRAMMAR_COMPILE_BUCKETS, GRAMMAR_MASK_BUCKETS, GrammarStats
from paged_core.structured import (
    CompiledGrammar,
    ConstraintError,
    ConstraintTimeoutError,
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutputs,
    allocate_bitmask,
    fill_bitmask,
)

ApplyBitmask = Callable[[torch.Tensor, torch.Tensor, Sequence[int]], None]
"""``apply(logits, bitmask, rows)``: the backend's ``FusedOps.apply_token_bitmask``."""


class MaskStats:
    """Time spent masking: per step that had constrained rows, fill and apply together; and the compiles."""

    __slots__ = (
        "compile_buckets",
        "compile_errors",
        "compile_s",
        "compile_seconds",
        "compile_timeouts",
        "mask_buckets",
        "requests",
        "rows",
        "seconds",
        "steps",
    )

    def __init__(self) -> None:
        self.steps = 0
        self.rows = 0
        self.seconds = 0.0
        self.compile_s: list[float] = []
        """Each grammar's compile time on its worker (:attr:`CompiledGrammar.compile_s`), in arrival order."""
        self.requests = 0
        self.compile_errors = 0
        self.compile_timeouts = 0
        self.compile_seconds = 0.0
        self.compile_buckets = [0] * (len(GRAMMAR_COMPILE_BUCKETS) + 1)
        self.mask_buckets = [0] * (len(GRAMMAR_MASK_BUCKETS) + 1)

    def snapshot(self) -> GrammarStats:
        """The counters for the wire (:class:`~paged_core.engine_core.messages.GrammarStats`)."""
        if not self.requests:
            return GrammarStats()
        return GrammarStats(
            self.requests,
            self.compile_errors,
            self.compile_timeouts,
            list(self.compile_buckets),
            self.compile_seconds,
            list(self.mask_buckets),
            self.seconds,
            self.rows,
        )


class Grammars:
    """The core's constraints: a lazily built compiler, the compiles in flight, and the masks of each step."""

    def __init__(self, make_compiler: Callable[[], GrammarCompiler], apply: ApplyBitmask) -> None:
        self._make_compiler = make_compiler
        self._compiler: GrammarCompiler | None = None
        self._apply = apply
        self._pending: dict[str, Future[CompiledGrammar]] = {}
        self._bitmask: torch.Tensor | None = None
        self.stats = MaskStats()

    @property
    def compiler(self) -> GrammarCompiler:
        """The compiler, built on first use (wrapping the tokenizer costs about a second)."""
        if self._compiler is None:
            self._compiler = self._make_compiler()
        return self._compiler

    # ---- compiles -------------------------------------------------------
    def submit(self, request_id: str, spec: StructuredOutputs) -> None:
        """Start compiling ``spec`` for ``request_id``; it comes back from :meth:`ready`."""
        self.stats.requests += 1
        self._pending[request_id] = self.compiler.submit(spec)

    def cancel(self, request_id: str) -> bool:
        """Forget a compile in flight (its request was aborted); False if there is none."""
        future = self._pending.pop(request_id, None)
        if future is not None:
            future.cancel()
        return future is not None

    @property
    def pending(self) -> int:
        """How many requests wait for their grammar."""
        return len(self._pending)

    def wait(self, timeout_s: float) -> None:
        """Sleep until some compile ends or ``timeout_s`` passes (only when nothing else can run)."""
        if self._pending:
            wait(list(self._pending.values()), timeout=timeout_s, return_when=FIRST_COMPLETED)

    def ready(self) -> tuple[dict[str, CompiledGrammar], dict[str, str]]:
        """The compiles that ended since the last call: grammars by request, and errors naming the field."""
        grammars: dict[str, CompiledGrammar] = {}
        errors: dict[str, str] = {}
        for rid, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[rid]
            exc = future.exception()
            if exc is None:
                grammar = future.result()
                grammars[rid] = grammar
                if grammar.cached:  # the compiler's cache answered: no compile to count
                    continue
                self.stats.compile_s.append(grammar.compile_s)
                self.stats.compile_seconds += grammar.compile_s
                self.stats.compile_buckets[bisect.bisect_left(GRAMMAR_COMPILE_BUCKETS, grammar.compile_s)] += 1
                continue
            if isinstance(exc, ConstraintTimeoutError):
                self.stats.compile_timeouts += 1
            else:
                self.stats.compile_errors += 1
            if isinstance(exc, ConstraintError):
                errors[rid] = str(exc)
            else:
                errors[rid] = f"structured_outputs: the constraint failed to compile ({type(exc).__name__}: {exc})"
        return grammars, errors

    # ---- masks ----------------------------------------------------------
    def _buffer(self, rows: int, vocab_size: int) -> torch.Tensor:
        """A reused ``[rows, words]`` bitmask (grown when a step needs more rows)."""
        buf = self._bitmask
        if buf is None or buf.shape[0] < rows or buf.shape[1] * 32 < vocab_size:
            buf = allocate_bitmask(max(rows, 8), vocab_size)
            self._bitmask = buf
        return buf[:rows]

    def mask(self, logits: torch.Tensor, rows: Sequence[int], matchers: Sequence[GrammarMatcher]) -> None:
        """Forbid on ``logits[rows[i]]`` what ``matchers[i]`` does not allow next."""
        if not rows:
            return
        start = time.perf_counter()
        bitmask = self._buffer(len(rows), self.compiler.vocab_size)
        fill_bitmask(matchers, bitmask)
        with torch.inference_mode():  # the runner's logits are inference tensors: written in place only in this mode
            self._apply(logits, bitmask, list(rows))
        self._count(len(rows), start)

    def mask_drafts(
        self,
        logits: torch.Tensor,
        starts: Sequence[int],
        matchers: Sequence[GrammarMatcher],
        drafts: Sequence[Sequence[int]],
    ) -> None:
        """Mask the verify rows of draft sequences: row ``starts[i] + j`` follows ``drafts[i][:j]``.

        Rows up to the draft's grammar-valid prefix get the grammar's mask there; the first invalid draft
        token is then forbidden on its row, so verification rejects it for sure and the rows after it are
        never used. Each matcher is left as it was.
        """
        if not matchers:
            return
        start = time.perf_counter()
        plan: list[tuple[GrammarMatcher, int, list[int]]] = []
        for row, matcher, draft in zip(starts, matchers, drafts, strict=True):
            valid = list(draft[: matcher.validate(draft)])
            plan.append((matcher, row, valid))
        total = sum(len(v) + 1 for _, _, v in plan)
        bitmask = self._buffer(total, self.compiler.vocab_size)
        bitmask.fill_(-1)
        rows: list[int] = []
        for matcher, row, valid in plan:
            taken = 0
            for j in range(len(valid) + 1):
                if matcher.is_terminated():  # past the grammar's end: the scheduler's stop rules cut there
                    break
                matcher.fill(bitmask, len(rows))
                rows.append(row + j)
                if j < len(valid):
                    if not matcher.accept(valid[j : j + 1]):
                        break
                    taken += 1
            matcher.rollback(taken)
        with torch.inference_mode():
            self._apply(logits, bitmask[: len(rows)], rows)
        self._count(len(rows), start)

    def _count(self, rows: int, start: float) -> None:
        seconds = time.perf_counter() - start
        self.stats.steps += 1
        self.stats.rows += rows
        self.stats.seconds += seconds
        self.stats.mask_buckets[bisect.bisect_left(GRAMMAR_MASK_BUCKETS, seconds)] += 1

    def close(self) -> None:
        """Stop the compiler's pool, if one was built."""
        if self._compiler is not None:
            self._compiler.close()
