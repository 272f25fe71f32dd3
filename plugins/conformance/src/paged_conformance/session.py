"""The active side of the pytest plugin: registered only when ``--paged-backend`` is given."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch

from paged_conformance import grid as grids
from paged_conformance.batch import Batch
from paged_conformance.expectations import Expectation
from paged_conformance.harness import LAYERS, expected
from paged_conformance.loading import BackendInfo
from paged_conformance.report import build_report, write_report
from paged_conformance.results import TestResult, absorb, declared_rows, fold, render_table
from paged_core.api import AttentionBackend, AttentionSpec, BackendCapabilities, FusedOps

CASES_MARK = "paged_cases"
CAPABILITY_MARK = "paged_capability"


class StaleExpectationWarning(UserWarning):
    """An expectations entry matched nothing, or an expected failure passed."""


@dataclass
class Conformance:
    """What the suite's checks receive through the ``conformance`` fixture."""

    info: BackendInfo
    device: torch.device
    grid: str
    oracle: str

    @property
    def caps(self) -> BackendCapabilities:
        return self.info.cls.capabilities()

    def backend(self) -> AttentionBackend:
        """A fresh backend instance on the device under test."""
        return self.info.cls(self.device)

    def fused_ops(self) -> FusedOps:
        """A fresh backend instance's ``fused_ops()``, which must be a :class:`FusedOps`."""
        ops = self.backend().fused_ops()
        if not isinstance(ops, FusedOps):
            raise AssertionError(f"fused_ops() returned {type(ops).__name__}, not a paged_core.api.FusedOps")
        return ops

    def expected(self, batch: Batch, spec: AttentionSpec | None = None) -> torch.Tensor:
        """The oracle's output for ``batch``."""
        return expected(self.oracle, batch, self.device, spec)


def _params(family: str, conf: Conformance) -> tuple[str, list[object], list[str]]:
    caps = conf.caps
    if family == "attention":
        cases = grids.attention_cases(caps, conf.grid)
        return "case", list(cases), [c.id for c in cases]
    if family == "features":
        cases = grids.feature_cases(caps, conf.grid)
        return "case", list(cases), [c.id for c in cases]
    if family == "quantized_kv":  # every one the suite knows: an undeclared one reports N/A
        return "kv_dtype", list(grids.QUANTIZED_KV), [grids.dtype_name(d) for d in grids.QUANTIZED_KV]
    if family == "block_sizes":
        return "block_size", list(caps.block_sizes), [f"b{b}" for b in caps.block_sizes]
    if family in ("fused", "fused_trace"):
        fused = grids.fused_cases(caps, conf.grid) if family == "fused" else grids.fused_trace_cases(caps, conf.grid)
        return "fused", list(fused), [c.id for c in fused]
    if family == "linear_formats":
        linear = grids.linear_format_cases(caps, conf.grid)
        return "linear_case", list(linear), [c.id for c in linear]
    if family == "batch_invariance":
        inv = grids.invariance_cases(caps, conf.grid)
        return "invariance", list(inv), [c.id for c in inv]
    if family == "batch_invariance_linear":
        lin = grids.invariance_linear_cases(caps, conf.grid)
        return "invariance_linear", list(lin), [c.id for c in lin]
    if family == "graph_sizes":
        sizes = grids.graph_batch_sizes(conf.grid)
        return "batch_size", list(sizes), [f"rows{s}" for s in sizes]
    raise ValueError(f"unknown {CASES_MARK} family {family!r}")


def fused_grid() -> dict[str, object]:
    """The ``grid.fused`` section of the report: the shapes the fused-op checks sweep."""
    return {
        "ops": list(grids.FUSED_OPS),
        "layouts": list(grids.FUSED_LAYOUTS),
        "norm_hidden": list(grids.NORM_HIDDEN),
        "tokens": list(grids.FUSED_TOKENS),
        "norm_eps": list(grids.NORM_EPS),
        "silu_intermediate": list(grids.SILU_INTERMEDIATE),
        "rotary_heads": [list(h) for h in grids.ROTARY_HEADS],
        "rotary_max_position": grids.ROTARY_MAX_POSITION,
        "rotary_base": grids.ROTARY_BASE,
        "rotation_heads": list(grids.ROTATION_HEADS),
        "linear_tokens": list(grids.LINEAR_TOKENS),
        "linear_shapes": [list(s) for s in grids.LINEAR_SHAPES],
    }


def linear_formats_grid(grid: str) -> dict[str, object]:
    """The ``grid.linear_formats`` section of the report: per format, each packed weight ``[N, K]``, whether it has a
    bias, and its calls as ``[M, layout]``."""
    return {
        "formats": {
            f: [
                {"shape": [w.n, w.k], "bias": w.bias, "calls": [list(c) for c in w.calls]}
                for w in grids.linear_weights(f, grid)
            ]
            for f in grids.LINEAR_FORMATS
        },
        "layouts": list(grids.LINEAR_LAYOUTS),
        "fallback": {f: [[w.n, w.k] for w in grids.linear_fallback_weights(f)] for f in grids.LINEAR_FORMATS},
    }


def invariance_grid(grid: str) -> dict[str, object]:
    """The ``grid.batch_invariance`` section of the report: the rows, shapes and steps the section uses."""
    return {
        "rows": list(grids.INVARIANCE_ROWS),
        "pool": grids.INVARIANCE_POOL,
        "alone": grids.INVARIANCE_ALONE,
        "chunks": list(grids.INVARIANCE_CHUNKS),
        "linear_shapes": [list(s) for s in grids.INVARIANCE_LINEAR_SHAPES],
        "norm_hidden": list(grids.INVARIANCE_NORM_HIDDEN),
        "silu_intermediate": list(grids.INVARIANCE_SILU_INTERMEDIATE),
        "rotary_heads": list(grids.INVARIANCE_ROTARY_HEADS),
        "rotation_heads": grids.INVARIANCE_ROTATION_HEADS,
        "seq_lens": [str(v) for v in grids.INVARIANCE_SEQ_LENS],
        "random_seqs": grids.INVARIANCE_RANDOM_SEQS,
        "random_steps": grids.INVARIANCE_BATCHES,
        "chunk": grids.INVARIANCE_CHUNK,
        "chunk_seqs": list(grids.INVARIANCE_CHUNK_SEQS),
    }


def item_capabilities(item: pytest.Item) -> list[str]:
    """The report rows an item counts towards: its marker's names, else its case's axes; plus its block size."""
    caps: list[str] = []
    for mark in item.iter_markers(CAPABILITY_MARK):
        caps.extend(str(a) for a in mark.args)
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("case")
    if isinstance(case, grids.Case) and not caps:
        # Grid axes count only for plain attention checks; a feature check counts under its feature.
        caps.extend(case.capabilities())
    linear = params.get("linear_case")
    if isinstance(linear, grids.LinearFormatCase) and not caps:  # the fallback check counts under its own row
        caps.extend(linear.capabilities())
    invariance = params.get("invariance_linear")
    if isinstance(invariance, grids.InvarianceLinearCase) and not caps:
        caps.extend(invariance.capabilities())
    if "block_size" in params:
        caps.append(f"block_size:{params['block_size']}")
    kv_dtype = params.get("kv_dtype")
    if isinstance(kv_dtype, torch.dtype):
        caps.append(f"kv_dtype:{grids.dtype_name(kv_dtype)}")
    return list(dict.fromkeys(caps))


class ConformanceSession:
    """Parametrizes the suite, applies expectations, collects outcomes, writes the reports."""

    def __init__(self, conf: Conformance, expectations: list[Expectation], strict: bool, json_path: str | None):
        self.conf = conf
        self.expectations = expectations
        self.strict = strict
        self.json_path = json_path
        self.results: dict[str, TestResult] = {}
        self.report: dict[str, object] | None = None
        self._fused_info: dict[str, object] | None = None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        mark = metafunc.definition.get_closest_marker(CASES_MARK)
        if mark is None:
            return
        name, values, ids = _params(str(mark.args[0]), self.conf)
        metafunc.parametrize(name, values, ids=ids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After deselection (-k, -m): only tests that will run are matched and reported.
        for item in session.items:
            caps = item_capabilities(item)
            self.results[item.nodeid] = TestResult(item.nodeid, caps)
            for exp in self.expectations:
                if not exp.matches(item.nodeid, caps):
                    continue
                exp.matched.append(item.nodeid)
                reason = f"expected: {exp.reason}"
                xfail = exp.status == "xfail"
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False) if xfail else pytest.mark.skip(reason))
                break  # the first matching entry wins
        for exp in self.expectations:
            if not exp.matched:
                stale = StaleExpectationWarning(f"stale expectation {exp.label()}: matches no test")
                warnings.warn(stale, stacklevel=1)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        result = self.results.setdefault(report.nodeid, TestResult(report.nodeid, []))
        absorb(result, report)
        if result.outcome == "xpassed" and report.when == "call":
            for exp in self.expectations:
                if report.nodeid in exp.matched and report.nodeid not in exp.passed:
                    exp.passed.append(report.nodeid)

    def stale(self) -> list[str]:
        """Every stale expectation, described."""
        return [f"{e.label()}: {e.stale_reason()}" for e in self.expectations if e.stale_reason()]

    def context(self) -> dict[str, object]:
        """Backend, grid and oracle sections of the report."""
        info, conf = self.info_dict(), self.conf
        grid = {
            "name": conf.grid,
            "graph_capture_sizes": list(grids.graph_capture_sizes(conf.grid)),
            "graph_batch_sizes": list(grids.graph_batch_sizes(conf.grid)),
            "head_sizes": list(grids.HEAD_SIZES),
            "gqa_ratios": list(grids.GQA_RATIOS),
            "kinds": list(grids.KINDS),
            "lengths": list(grids.LENGTHS),
            "num_kv_heads": grids.NUM_KV_HEADS,
            "num_kv_heads_sweep": list(grids.KV_HEAD_SWEEP),
            "long_context": grids.LONG_CONTEXT,
            "scale": grids.SCALE,
            "layouts": list(grids.LAYOUTS),
            "kv_dtypes": [grids.dtype_name(d) for d in grids.KV_DTYPES],
            "layers": LAYERS,
            "fused": fused_grid(),
            "linear_formats": linear_formats_grid(conf.grid),
            "batch_invariance": invariance_grid(conf.grid),
        }
        return {"backend": info, "grid": grid, "oracle": conf.oracle}

    def info_dict(self) -> dict[str, object]:
        info = self.conf.info
        return {
            "name": info.name,
            "class": f"{info.cls.__module__}:{info.cls.__qualname__}",
            "distribution": info.distribution,
            "version": info.version,
            "device": str(self.conf.device),
            "api_version": info.cls.api_version,
            "capabilities": self.conf.caps.to_dict(),
            "fused_ops": self.fused_info(),
        }

    def fused_info(self) -> dict[str, object]:
        """The backend's ``fused_ops()`` class, name and overridden methods (worked out once)."""
        if self._fused_info is None:
            from paged_conformance.fused import fused_ops_info

            self._fused_info = fused_ops_info(self.conf.backend)
        return self._fused_info

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        stale = self.stale()
        for line in stale:
            if "matches no test" not in line:
                warnings.warn(StaleExpectationWarning(f"stale expectation {line}"), stacklevel=1)
        if stale and self.strict and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        fused = self.fused_info()
        formats, kinds = fused.get("linear_formats"), fused.get("batch_invariant_linear")
        declared_formats = frozenset(str(f) for f in formats) if isinstance(formats, list) else frozenset()
        invariant_kinds = frozenset(str(k) for k in kinds) if isinstance(kinds, list) else frozenset()
        rows = fold(
            declared_rows(
                self.conf.caps, declared_formats, invariant_kinds, fused.get("batch_invariant_layer_ops") is True
            ),
            list(self.results.values()),
        )
        self.rows = rows
        self.report = build_report(
            self.context(), rows, list(self.results.values()), self.expectations, int(session.exitstatus)
        )
        if self.json_path:
            write_report(self.json_path, self.report)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        info = self.conf.info
        tr.write_sep(
            "=",
            f"paged-conformance: {info.name} on {self.conf.device} (grid {self.conf.grid}, oracle {self.conf.oracle})",
        )
        fused = self.fused_info()
        if "error" in fused:
            tr.write_line(f"fused ops: fused_ops() raised {fused['error']}", red=True)
        else:
            names = fused.get("overrides")
            overrides = ", ".join(str(n) for n in names) if isinstance(names, list) and names else "none (reference)"
            formats = fused.get("linear_formats")
            packed = ", ".join(str(f) for f in formats) if isinstance(formats, list) and formats else "none"
            tr.write_line(
                f"fused ops: {fused['name']} ({fused['class']}); overrides: {overrides}; linear formats: {packed}"
            )
            kinds = fused.get("batch_invariant_linear")
            invariant = ", ".join(str(k) for k in kinds) if isinstance(kinds, list) and kinds else "none"
            tr.write_line(
                f"batch invariance: attention {'yes' if self.conf.caps.batch_invariant else 'no'}; "
                f"layer ops {'yes' if fused.get('batch_invariant_layer_ops') is True else 'no'}; "
                f"linear: {invariant}"
            )
        for line in render_table(getattr(self, "rows", {})):
            tr.write_line(line)
        for line in self.stale():
            tr.write_line(f"STALE expectation {line}" + (" (error under --strict)" if self.strict else ""), yellow=True)
        if self.json_path:
            tr.write_line(f"JSON report: {self.json_path}")
