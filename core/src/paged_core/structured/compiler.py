"""Compiling constraints for one tokenizer on a small thread pool (llguidance underneath).

Built once per model: wrapping the tokenizer costs ~1.5 s here. :meth:`GrammarCompiler.submit` returns at
once with a :class:`~concurrent.futures.Future`; the compile (grammar, lexer and the first mask, which
llguidance otherwise builds lazily on the first step) runs on the pool, bounded by llguidance's size and
fuel limits and by the compiler's timeout. A refused constraint fails its future with
:class:`.ConstraintCompileError`, a slow one with :class:`.ConstraintTimeoutError`, each naming the field;
other compiles go on.

Compiled grammars are kept (least recently used first out, :data:`CACHE_SIZE` of them): agents send the same
schema with every turn, and a server checks each constraint before its core compiles it again, so a repeat costs
a copy of the compiled matcher instead of a compile. A compile still running is shared by every request for the
same constraint; failures are not kept (a timeout may be the machine's load, not the grammar's).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from paged_core.structured.bitmask import allocate_bitmask, bitmask_width
from paged_core.structured.errors import ConstraintCompileError, ConstraintTimeoutError
from paged_core.structured.matcher import GrammarMatcher
from paged_core.structured.spec import StructuredOutputs

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

DEFAULT_TIMEOUT_S = 10.0
# Compact JSON, no free whitespace: a model cannot stall a schema by emitting blanks forever.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_SIZE = 200_000
"""llguidance's bound on grammar symbols (its default is 500,000)."""
CACHE_SIZE = 256
"""Compiled grammars kept per compiler (each holds its lexer: tens to hundreds of KiB)."""


class CompiledGrammar:
    """A constraint compiled for one tokenizer: :meth:`matcher` starts a sequence on it."""

    def __init__(self, template: Any, field: str, compile_s: float, cached: bool = False) -> None:
        self._template = template
        self.field = field
        """The :class:`.StructuredOutputs` field it came from."""
        self.compile_s = compile_s
        """Seconds the compile took on its worker (for metrics)."""
        self.cached = cached
        """True when this came from the compiler's cache (no compile ran for it)."""

    def reused(self) -> CompiledGrammar:
        """This grammar as a cache hit hands it out."""
        return CompiledGrammar(self._template, self.field, self.compile_s, cached=True)

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar."""
        return GrammarMatcher(self._template.deep_copy(), self.field)


def _grammar_text(spec: StructuredOutputs) -> str:
    """The spec as an llguidance grammar (JSON of its grammar list); may raise ValueError on bad JSON."""
    from llguidance import LLMatcher

    if spec.json is not None:
        return str(LLMatcher.grammar_from_json_schema(spec.json, JSON_OPTIONS))
    if spec.json_object:
        return str(LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS))
    if spec.regex is not None:
        return str(LLMatcher.grammar_from_regex(spec.regex))
    if spec.choice is not None:
        # Lark string literals read JSON's escapes, so json.dumps quotes any choice exactly.
        return str(LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice)))
    return str(LLMatcher.grammar_from_lark(str(spec.grammar)))


class GrammarCompiler:
    """Compiles :class:`.StructuredOutputs` for one tokenizer on ``max_workers`` threads.

    ``tokenizer`` is a fast Hugging Face tokenizer; ``vocab_size`` the model's (its logits' width), which
    may exceed the tokenizer's: the ids past the tokenizer's are never allowed. ``timeout_s`` bounds each
    compile from submission: a future not done by then fails with :class:`.ConstraintTimeoutError` (the
    worker finishes that compile in the background; llguidance's limits bound how long).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        max_workers: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        import llguidance
        import llguidance.hf

        base = len(tokenizer)
        self.vocab_size = base if vocab_size is None else vocab_size
        if self.vocab_size < base:
            raise ValueError(f"vocab_size {self.vocab_size} is below the tokenizer's {base} tokens")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0; got {timeout_s}")
        self.timeout_s = timeout_s
        self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.vocab_size)
        self._limits = llguidance.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SIZE, verbose_errors=False)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[StructuredOutputs, CompiledGrammar] = OrderedDict()
        self._running: dict[StructuredOutputs, Future[CompiledGrammar]] = {}
        self._lock = threading.Lock()

    def submit(self, spec: StructuredOutputs) -> Future[CompiledGrammar]:
        """Start compiling ``spec``; the future holds a :class:`CompiledGrammar` or a :class:`.ConstraintError`.

        A constraint compiled before comes back at once from the cache; one compiling now shares that compile.
        """
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                done: Future[CompiledGrammar] = Future()
                done.set_result(hit.reused())
                return done
            running = self._running.get(spec)
            if running is not None:
                return _follow(running)
            outer = self._start(spec)
            self._running[spec] = outer
        outer.add_done_callback(lambda f: self._settled(spec, f))
        return _follow(outer)

    def _settled(self, spec: StructuredOutputs, future: Future[CompiledGrammar]) -> None:
        with self._lock:
            self._running.pop(spec, None)
            if future.exception() is None:
                self._cache[spec] = future.result()
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)

    def _start(self, spec: StructuredOutputs) -> Future[CompiledGrammar]:
        """One compile of ``spec`` on the pool, failed by the timer if it runs past ``timeout_s``."""
        outer: Future[CompiledGrammar] = Future()
        field = spec.kind
        timer = threading.Timer(self.timeout_s, self._expire, (outer, field))
        timer.daemon = True
        inner = self._pool.submit(self._compile, spec)

        def settle(done: Future[CompiledGrammar]) -> None:
            timer.cancel()
            if outer.done():
                return
            error = done.exception()
            try:
                if error is None:
                    outer.set_result(done.result())
                else:
                    outer.set_exception(error)
            except InvalidStateError:  # the timer won the race: its answer stands
                pass

        timer.start()
        inner.add_done_callback(settle)
        return outer

    def compile(self, spec: StructuredOutputs) -> CompiledGrammar:
        """:meth:`submit` and wait (raises the future's error)."""
        return self.submit(spec).result()

    def _expire(self, outer: Future[CompiledGrammar], field: str) -> None:
        try:
            outer.set_exception(ConstraintTimeoutError(field, f"did not compile within {self.timeout_s:g} s"))
        except InvalidStateError:  # the compile finished first
            pass

    def _compile(self, spec: StructuredOutputs) -> CompiledGrammar:
        from llguidance import LLMatcher

        field = spec.kind
        start = time.perf_counter()
        try:
            grammar = _grammar_text(spec)
        except ValueError as exc:
            raise ConstraintCompileError(field, str(exc)) from None
        matcher = LLMatcher(self._ll_tokenizer, grammar, log_level=0, limits=self._limits)
        if not matcher.is_error():
            # The first mask builds the lexer llguidance makes lazily: a pathological one fails here, not mid-step.
            matcher.unsafe_compute_mask_ptr(*_scratch(self.vocab_size))
        if matcher.is_error():
            raise ConstraintCompileError(field, matcher.get_error())
        return CompiledGrammar(matcher, field, time.perf_counter() - start)

    def close(self) -> None:
        """Stop the pool (running compiles finish; queued ones are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _follow(source: Future[CompiledGrammar]) -> Future[CompiledGrammar]:
    """A future of its own that ends as ``source`` does: a caller cancelling it leaves ``source`` to the others."""
    mine: Future[CompiledGrammar] = Future()

    def copy(done: Future[CompiledGrammar]) -> None:
        if mine.done():
            return
        error = done.exception()
        try:
            if error is None:
                mine.set_result(done.result())
            else:
                mine.set_exception(error)
        except InvalidStateError:  # cancelled by its caller meanwhile
            pass

    source.add_done_callback(copy)
    return mine


_SCRATCH = threading.local()


def _scratch(vocab_size: int) -> tuple[int, int]:
    """A per-thread one-row bitmask to compute the first mask into: ``(pointer, bytes)``."""
    row = getattr(_SCRATCH, "row", None)
    if row is None or row.shape[1] != bitmask_width(vocab_size):
        row = allocate_bitmask(1, vocab_size)
        _SCRATCH.row = row
    return row.data_ptr(), row.numel() * row.element_size()
