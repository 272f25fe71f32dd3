"""xgrammar against llguidance on the embedded model's vocabulary (SmolLM2, 49,152 ids): compile and mask time.

Over 24 JSON schemas (nested objects, bounded arrays, enums, ranged numbers, optional fields,
``additionalProperties: false``) plus a regex, a choice and a grammar (xgrammar reads EBNF, llguidance
Lark; the same language), each engine, single-threaded:

- compile, cold: a fresh xgrammar ``GrammarCompiler`` with its cache off per compile; a fresh llguidance
  ``LLMatcher`` (it has no grammar cache). llguidance builds its lexer lazily, so ``compile`` alone flatters
  it: ``first mask`` (compile plus the first bitmask fill) is the figure a request waits for.
- per-step mask at 1 row: one matcher walking a seeded random path of allowed tokens, each fill timed.
- per-step mask at 32 rows: 32 matchers (the constraints, cycled), each a few tokens in, fill all 32 rows
  one after the other and through the engine's batch path (xgrammar ``BatchGrammarMatcher``, llguidance
  ``LLExecutor``, both at 2 threads), then apply to [32, 49152] fp32 logits three ways: unpacking the bits
  into a ``masked_fill_``, paged's ``apply_bitmask`` (a byte table of additive biases) and xgrammar's CPU kernel.

Not a test: the machine is shared, so read the figures. xgrammar is not a project dependency; rerun (about
a minute) with it installed beside the pinned torch, which it leaves alone:

    .venv/bin/pip install -c ci/constraints.txt xgrammar==0.2.8
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/grammar_engines.py

Choice: llguidance 1.9.1 (paged_core.structured). Measured on a 2-core Sapphire Rapids (lscpu: "Intel(R) Xeon(R)
Processor"), p50 / p99 in ms (benchmarks/results/2026-12-04-grammar-engines.json):

    ms (p50 / p99)                    xgrammar 0.2.8    llguidance 1.9.1
    compile + first mask, cold        1.09 / 314.9      0.37 / 1.01
    mask, 1 row                       0.002 / 0.064     0.018 / 0.155
    mask, 32 rows one by one          0.17 / 2.50       0.66 / 1.19
    mask, 32 rows batch (2 threads)   0.31 / 2.51       0.43 / 0.70
    apply, 32 x 49152 fp32: torch byte-table add 2.7, unpack + masked_fill 2.8, xgrammar CPU kernel 4.4

xgrammar's per-row mask is faster at the median (its adaptive mask cache), but its compile tail is two
orders of magnitude worse: a string with ``maxLength: 40`` costs it ~0.3 s (bounded repetitions grow its
compile: a 5,000-character bound 0.3-0.6 s, llguidance 3 ms), and at 32 rows its p99 is the higher one.
Both masks are far below a decode step. Beyond the figures: llguidance is one 3 MB abi3 wheel with no
dependencies (MIT), while xgrammar 0.2.8 requires torch, transformers, triton, pydantic and apache-tvm-ffi
(it accepts the pinned torch 2.13.0+cpu and changes nothing, but every torch upgrade would wait on its
range); llguidance bounds a grammar's work by fuel and size limits (``LLParserLimits``), so a pathological
constraint fails by itself; its matcher validates drafts, rolls back and deep-copies, which speculation
and ``n > 1`` need. Both are maintained (xgrammar by MLC, llguidance by Microsoft's guidance team; vLLM
ships both). xgrammar's CPU apply kernel does not decide it: the torch apply paged ships is faster here.
The one cost: llguidance wraps the tokenizer in ~1.5 s (xgrammar 0.2 s), once per model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results" / "2026-12-04-grammar-engines.json"
EOS = 2  # SmolLM2's <|endoftext|>

_OBJ = {"type": "object", "additionalProperties": False}


def _obj(props: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    return {**_OBJ, "properties": props, "required": list(props) if required is None else list(required)}


SCHEMAS: list[dict[str, Any]] = [
    _obj({"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}}),
    _obj({"ok": {"type": "boolean"}}),
    _obj({"x": {"type": "number", "minimum": -1, "maximum": 1}, "y": {"type": "number"}}),
    _obj({"colour": {"enum": ["red", "green", "blue"]}, "shade": {"type": "integer", "minimum": 1, "maximum": 9}}),
    _obj({"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}}),
    _obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "maxItems": 5}}),
    _obj({"id": {"type": "integer"}, "note": {"type": "string"}}, required=["id"]),
    _obj({"user": _obj({"name": {"type": "string"}, "email": {"type": "string"}})}),
    _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "integer"}})})})}),
    _obj({"items": {"type": "array", "items": _obj({"sku": {"type": "string"}, "qty": {"type": "integer"}})}}),
    _obj({"status": {"enum": ["open", "closed", "pending", "archived"]}, "count": {"type": "integer"}}),
    _obj({"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180}}),
    _obj({"title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1900}}),
    _obj({"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3}}}),
    _obj({"kind": {"const": "event"}, "at": {"type": "string", "format": "date-time"}}),
    _obj({"value": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}),
    _obj({"maybe": {"type": ["string", "null"]}, "n": {"type": "integer"}}),
    _obj(
        {
            "name": {"type": "string"},
            "address": _obj({"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}}),
            "phones": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        },
        required=["name"],
    ),
    _obj({"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4}}),
    _obj({"rating": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": {"type": "string"}}),
    {"type": "array", "items": _obj({"k": {"type": "string"}, "v": {"type": "integer"}}), "minItems": 1, "maxItems": 4},
    _obj({"tool": {"enum": ["search", "calc"]}, "arguments": _obj({"query": {"type": "string"}})}),
    _obj({"p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "label": {"type": "string"}}),
    _obj({f"f{i}": {"type": "integer"} for i in range(12)}, required=[f"f{i}" for i in range(0, 12, 2)]),
]
"""24 schemas; every object closed (``additionalProperties: false``)."""

REGEX = r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}"
CHOICE = ["positive", "negative", "neutral", "mixed feelings"]
GRAMMAR_EBNF = """root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")"
num ::= [0-9]+
"""
GRAMMAR_LARK = """start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUM | "(" expr ")"
NUM: /[0-9]+/
"""

CONSTRAINTS: list[tuple[str, Any]] = [("json", s) for s in SCHEMAS] + [
    ("regex", REGEX),
    ("choice", CHOICE),
    ("grammar", None),
]
SEPARATORS = (", ", ": ")


class Engine:
    """One engine's compile, fill, accept and reset behind one shape."""

    name: str

    def compile(self, kind: str, value: Any) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def done(self, matcher: Any) -> bool:
        raise NotImplementedError

    def reset(self, matcher: Any) -> None:
        matcher.reset()


class Xgrammar(Engine):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)

    def compile(self, kind: str, value: Any) -> Any:
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        if kind == "json":
            return compiler.compile_json_schema(json.dumps(value), any_whitespace=False, separators=SEPARATORS)
        if kind == "regex":
            return compiler.compile_regex(value)
        if kind == "choice":
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in value))
        return compiler.compile_grammar(GRAMMAR_EBNF)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def done(self, matcher: Any) -> bool:
        return bool(matcher.is_terminated())


class Llguidance(Engine):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.executor = llguidance.LLExecutor(num_threads=2)

    def compile(self, kind: str, value: Any) -> Any:
        m = self.llg.LLMatcher
        options = {"whitespace_flexible": False, "item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1]}
        if kind == "json":
            grammar = m.grammar_from_json_schema(value, options)
        elif kind == "regex":
            grammar = m.grammar_from_regex(value)
        elif kind == "choice":
            grammar = m.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
        else:
            grammar = m.grammar_from_lark(GRAMMAR_LARK)
        matcher = m(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher  # the compiled form is a fresh matcher: deep_copy() makes more

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        self.llg.torch.fill_next_token_bitmask(matcher, bitmask, row)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.llg.torch.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def done(self, matcher: Any) -> bool:
        return bool(matcher.is_stopped())


_BITS = torch.arange(32, dtype=torch.int32)


def allowed_ids(bitmask_row: torch.Tensor, vocab: int) -> list[int]:
    return torch.nonzero(((bitmask_row.unsqueeze(-1) >> _BITS) & 1).flatten()[:vocab]).flatten().tolist()


def apply_unpack(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The plain apply: unpack the bits, ``masked_fill_`` what is not allowed."""
    allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).view(bitmask.shape[0], -1)[:, : logits.shape[1]]
    logits.masked_fill_(allowed == 0, float("-inf"))


def apply_shipped(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """What paged ships: :func:`paged_core.structured.apply_bitmask` (a byte table of additive biases)."""
    from paged_core.structured import apply_bitmask

    apply_bitmask(logits, bitmask, list(range(bitmask.shape[0])))


def pick(bitmask: torch.Tensor, row: int, vocab: int, rng: random.Random) -> int:
    """A seeded random allowed token (EOS only when nothing else is allowed)."""
    ids = allowed_ids(bitmask[row], vocab)
    return rng.choice([t for t in ids if t != EOS] or ids)


def advance(engine: Engine, matcher: Any, token: int) -> None:
    assert engine.accept(matcher, token), f"{engine.name} refused a token its own mask allowed"
    if engine.done(matcher):
        engine.reset(matcher)


def step(engine: Engine, matcher: Any, bitmask: torch.Tensor, row: int, vocab: int, rng: random.Random) -> None:
    advance(engine, matcher, pick(bitmask, row, vocab, rng))


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {"p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": max(ms), "mean_ms": statistics.fmean(ms)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(engine: Engine, vocab: int, reps: int, steps: int) -> dict[str, Any]:
    compile_s, first_s, worst = [], [], ("", 0.0)
    for i, (kind, value) in enumerate(CONSTRAINTS):
        for _ in range(reps):
            bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
            t0 = time.perf_counter()
            compiled = engine.compile(kind, value)
            t1 = time.perf_counter()
            engine.fill(engine.matcher(compiled), bitmask, 0)
            t2 = time.perf_counter()
            compile_s.append(t1 - t0)
            first_s.append(t2 - t0)
            if t2 - t0 > worst[1]:
                worst = (f"{kind} #{i}", t2 - t0)
    compiled_all = [engine.compile(kind, value) for kind, value in CONSTRAINTS]
    rng = random.Random(0)
    one_row = []
    for compiled in compiled_all:
        matcher = engine.matcher(compiled)
        bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
        for _ in range(steps):
            dt, _ = timed(lambda m=matcher, b=bitmask: engine.fill(m, b, 0))
            one_row.append(dt)
            step(engine, matcher, bitmask, 0, vocab, rng)
    rows = 32
    matchers = [engine.matcher(compiled_all[i % len(compiled_all)]) for i in range(rows)]
    bitmask = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)
    for _ in range(4):  # a few tokens in
        for r, m in enumerate(matchers):
            engine.fill(m, bitmask, r)
            step(engine, m, bitmask, r, vocab, rng)
    seq, par, apply_plain, apply_ours, apply_kernel, accept = [], [], [], [], [], []
    logits = torch.randn(rows, vocab)
    for _ in range(steps):
        t0 = time.perf_counter()
        for r, m in enumerate(matchers):
            engine.fill(m, bitmask, r)
        seq.append(time.perf_counter() - t0)
        dt, _ = timed(lambda: engine.fill_batch(matchers, bitmask))
        par.append(dt)
        outs = []
        for fn, times in ((apply_unpack, apply_plain), (apply_shipped, apply_ours), (xgr_apply, apply_kernel)):
            work = logits.clone()
            times.append(timed(lambda f=fn, w=work: f(w, bitmask))[0])
            outs.append(work)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), "the applies disagree"
        tokens = [pick(bitmask, r, vocab, rng) for r in range(rows)]
        t0 = time.perf_counter()
        for m, token in zip(matchers, tokens, strict=True):
            advance(engine, m, token)
        accept.append(time.perf_counter() - t0)
    return {
        "compile": summary(compile_s),
        "first_mask": summary(first_s),
        "slowest_first_mask": {"constraint": worst[0], "ms": worst[1] * 1e3},
        "mask_1_row": summary(one_row),
        "mask_32_rows_sequential": summary(seq),
        "mask_32_rows_batch_2_threads": summary(par),
        "apply_32_rows_torch_unpack_masked_fill": summary(apply_plain),
        "apply_32_rows_paged_apply_bitmask": summary(apply_ours),
        "apply_32_rows_xgrammar_cpu_kernel": summary(apply_kernel),
        "accept_32_rows": summary(accept),
    }


def xgr_apply(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, backend="cpu")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="cold compiles per constraint")
    p.add_argument("--steps", type=int, default=24, help="timed mask steps per walk")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    torch.set_num_threads(1)
    from importlib.metadata import version

    from paged_core.loading.loader import load_tokenizer, resolve_source

    tokenizer = load_tokenizer(resolve_source(None))
    vocab = len(tokenizer)
    results: dict[str, Any] = {}
    for cls in (Xgrammar, Llguidance):
        setup_s, engine = timed(lambda c=cls: c(tokenizer, vocab))
        results[engine.name] = {"version": version(engine.name), "tokenizer_setup_ms": setup_s * 1e3}
        results[engine.name].update(measure(engine, vocab, a.reps, a.steps))
    print(f"{'ms (p50 / p99)':<40}" + "".join(f"{n:>22}" for n in results))
    for key in next(iter(results.values())):
        if key in ("version", "tokenizer_setup_ms", "slowest_first_mask"):
            if key == "version":
                print(f"{key:<40}" + "".join(f"{r[key]:>22}" for r in results.values()))
            continue
        print(f"{key:<40}" + "".join(f"{r[key]['p50_ms']:>12.3f} / {r[key]['p99_ms']:<7.3f}" for r in results.values()))
    for name, r in results.items():
        print(f"{name}: tokenizer setup {r['tokenizer_setup_ms']:.0f} ms; slowest first mask {r['slowest_first_mask']}")
    doc = {
        "benchmark": "benchmarks/grammar_engines.py",
        "machine": {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0))},
        "torch": torch.__version__,
        "vocab": vocab,
        "constraints": {"json_schemas": len(SCHEMAS), "regex": 1, "choice": 1, "grammar": 1},
        "reps": a.reps,
        "steps": a.steps,
        "results": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
