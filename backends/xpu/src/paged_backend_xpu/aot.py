"""Ahead-of-time check for Intel GPUs: compile every specialization to native pvc and dg2 code, no GPU needed.

``python -m paged_backend_xpu.aot`` compiles each specialization the ``xpu`` family launches
(:func:`paged_triton.specializations.all_specializations`) with Intel's Triton backend (PyPI ``triton-xpu``)
to SPIR-V, then runs IGC's offline compiler ``ocloc`` on it for pvc (Data Center GPU Max 1550) and dg2
(Arc A770, ACM-G10) with the build flags Triton itself recorded for the launch (the GRF mode). It prints one
row per (kernel, target): GRF mode, registers used of those available, spills; and exits 1 on any spill or
compile error. Registers and spills come from IGC's own assembly dump (``//.spill size``, register
declarations), cross-checked with ocloc's "allocated N regs and spilled around M" warning.

Needs triton in compiled mode (``TRITON_INTERPRET`` unset), an environment with triton-xpu, and ocloc in
``$PAGED_OCLOC_DIR`` (default ``~/.cache/paged/ocloc``): ``backends/xpu/ci/aot-toolchain.sh`` sets up both.
This module imports neither triton nor torch's XPU support until it compiles.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCLOC_DIR_ENV = "PAGED_OCLOC_DIR"
DEFAULT_OCLOC_DIR = "~/.cache/paged/ocloc"
TOOLCHAIN_HINT = "bash backends/xpu/ci/aot-toolchain.sh"


@dataclass(frozen=True)
class Target:
    """One Intel GPU: ocloc's device name, its register width, and the properties Triton compiles against."""

    device: str
    grf_bytes: int
    """Bytes per GRF register (64 on Xe-HPC, 32 on Xe-HPG)."""
    properties: tuple[tuple[str, object], ...]
    """Triton's ``GPUTarget("xpu", arch, ...)`` dict: what the SYCL runtime reports for the device."""


TARGETS: dict[str, Target] = {
    # Data Center GPU Max 1550: sub-groups 16/32, DPAS (incl. tf32), 2D block loads.
    "pvc": Target(
        "pvc",
        64,
        (
            ("max_work_group_size", 1024),
            ("max_num_sub_groups", 64),
            ("sub_group_sizes", (16, 32)),
            ("has_fp64", True),
            ("has_subgroup_matrix_multiply_accumulate", True),
            ("has_subgroup_matrix_multiply_accumulate_tensor_float32", True),
            ("has_subgroup_2d_block_io", True),
            ("has_bfloat16_conversions", True),
        ),
    ),
    # Arc A770 (ACM-G10): sub-groups 8/16/32 (so Triton keeps its dots off DPAS), no 2D block loads, no fp64.
    "dg2": Target(
        "acm-g10",
        32,
        (
            ("max_work_group_size", 1024),
            ("max_num_sub_groups", 128),
            ("sub_group_sizes", (8, 16, 32)),
            ("has_fp64", False),
            ("has_subgroup_matrix_multiply_accumulate", True),
            ("has_subgroup_matrix_multiply_accumulate_tensor_float32", False),
            ("has_subgroup_2d_block_io", False),
            ("has_bfloat16_conversions", True),
        ),
    ),
}


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses on one target."""

    label: str
    target: str
    grf_mode: str
    registers: str
    spills: int
    """Registers spilled (ocloc's "spilled around" count, or the dump's spill bytes over the register width)."""
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.spills == 0 and not self.note.startswith("error")


@dataclass(frozen=True)
class OclocWarning:
    """ocloc's "kernel K compiled SIMDw allocated N regs and spilled around M" line."""

    kernel: str
    simd: int
    registers: int
    spilled: int


@dataclass(frozen=True)
class AsmStats:
    """From IGC's assembly dump of one kernel: GRFs available and touched, spill bytes."""

    num_grf: int
    used_grf: int
    spill_bytes: int


_WARNING = re.compile(r"kernel\s+(\S+)\s+compiled SIMD(\d+) allocated (\d+) regs and spilled around (\d+)")
_DECLARE = re.compile(r"^//\.declare .*\brf=r size=(\d+) type=(\w+).*\(r(\d+)\.(\d+)\)\s*$", re.MULTILINE)
_TYPE_BYTES = {"b": 1, "ub": 1, "w": 2, "uw": 2, "hf": 2, "bf": 2, "d": 4, "ud": 4, "f": 4, "q": 8, "uq": 8, "df": 8}


def parse_ocloc_log(text: str) -> list[OclocWarning]:
    """Every spill warning in ocloc's output (none when nothing spilled)."""
    return [
        OclocWarning(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in _WARNING.finditer(text)
    ]


def parse_asm(text: str, grf_bytes: int) -> AsmStats:
    """GRFs available (``//.thread_config numGRF``), GRFs covered by register-allocated variables, spill bytes."""
    config = re.search(r"^//\.thread_config numGRF=(\d+)", text, re.MULTILINE)
    spill = re.search(r"^//\.spill size (\d+)", text, re.MULTILINE)
    used: set[int] = set()
    for size, typ, reg, sub in _DECLARE.findall(text):
        start = int(reg) * grf_bytes + int(sub) * _TYPE_BYTES.get(typ, 4)
        end = start + max(1, int(size))
        used.update(range(start // grf_bytes, (end - 1) // grf_bytes + 1))
    return AsmStats(int(config.group(1)) if config else 0, len(used), int(spill.group(1)) if spill else 0)


def final_asm(paths: Sequence[str]) -> str | None:
    """The dump of IGC's last compile attempt: ``X_simd16_entry_0001.asm``, then ``X_1_simd16...``, ``X_2_...``."""

    def attempt(path: str) -> int:
        m = re.search(r"_(\d+)_simd\d+_entry", os.path.basename(path))
        return int(m.group(1)) if m else 0

    return max(paths, key=attempt) if paths else None


def grf_mode(build_flags: str) -> str:
    """The GRF mode that ``build_flags`` (Triton's recorded ocloc/L0 flags) select."""
    if "-cl-intel-512-GRF-per-thread" in build_flags:
        return "512"
    if "-cl-intel-256-GRF-per-thread" in build_flags:
        return "256"
    if "-cl-intel-128-GRF-per-thread" in build_flags:
        return "128"
    if "-cl-intel-enable-auto-large-GRF-mode" in build_flags:
        return "auto"
    return "default (128)"


def measure(label: str, target: str, flags: str, log: str, asm: str | None) -> Resources:
    """The report row for one kernel from ocloc's log and its last assembly dump (the spill gate)."""
    warnings = parse_ocloc_log(log)
    warned = max((w.spilled for w in warnings), default=0)
    if asm is None:
        regs = f"{max(w.registers for w in warnings)} (no dump)" if warnings else "? (no dump)"
        return Resources(label, target, grf_mode(flags), regs, warned, "spilled" if warned else "")
    stats = parse_asm(asm, TARGETS[target].grf_bytes)
    dumped = -(-stats.spill_bytes // TARGETS[target].grf_bytes)
    spills = max(warned, dumped)
    note = f"spill {stats.spill_bytes} B" if spills else ""
    return Resources(label, target, grf_mode(flags), f"{stats.used_grf}/{stats.num_grf}", spills, note)


def ocloc_path() -> Path:
    """The ``ocloc`` wrapper set up by the toolchain script; a clear error when it is missing."""
    root = Path(os.path.expanduser(os.environ.get(OCLOC_DIR_ENV) or DEFAULT_OCLOC_DIR))
    path = root / "ocloc"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"ocloc not found at {path} (${OCLOC_DIR_ENV}, default {DEFAULT_OCLOC_DIR}); get it with {TOOLCHAIN_HINT} "
            "(unpacks Debian bookworm's intel-opencl-icd and IGC there, no install) or point "
            f"${OCLOC_DIR_ENV} at a folder holding an ocloc executable"
        )
    return path


def _stub_device_probe() -> None:
    """Skip the Intel backend's SYCL helper (``arch_parser.c``, needs sycl.hpp and a Level Zero loader).

    It only names the device when the target's arch dict has an ``architecture`` entry, which ours has not.
    """
    from triton.backends import backends

    compiler = backends["intel"].compiler
    scope = compiler.__init__.__globals__
    if scope.get("_paged_stubbed"):
        return

    class _Probe:
        @staticmethod
        def parse_device_arch(_arch: object) -> str:
            return ""

    scope["compile_module_from_src"] = lambda *_args, **_kwargs: _Probe()
    scope["_paged_stubbed"] = True


def compile_spirv(spec: Any, target: str) -> tuple[bytes, str]:
    """SPIR-V of ``spec`` for ``target`` and the build flags Triton recorded for it (the launch's GRF mode)."""
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from paged_triton.launch import kernel_set
    from paged_triton.tiles import WARP_SIZE, num_warps

    if "intel" not in backends:
        raise RuntimeError(
            f"triton {triton.__version__} has no Intel backend: run in the environment of {TOOLCHAIN_HINT}"
        )
    _stub_device_probe()
    fn = getattr(kernel_set(), spec.kernel)
    source = ASTSource(fn, spec.signature(list(fn.arg_names)), dict(spec.constexprs))
    warp = WARP_SIZE["xpu"]
    options = {"num_warps": num_warps(spec.lanes, warp), **dict(spec.options)}
    arch = {k: list(v) if isinstance(v, tuple) else v for k, v in TARGETS[target].properties}
    kernel = triton.compile(source, target=GPUTarget("xpu", arch, warp), options=options)
    flags = str(getattr(kernel.metadata, "build_flags", "") or "")
    return kernel.asm["spv"], flags


def run_ocloc(spirv: bytes, target: str, flags: str) -> tuple[str, str | None]:
    """ocloc's output and IGC's last assembly dump for ``spirv`` on ``target`` (raises on a failed build)."""
    with tempfile.TemporaryDirectory(prefix="paged-xpu-aot-") as tmp:
        src = Path(tmp, "kernel.spv")
        src.write_bytes(spirv)
        dump = Path(tmp, "dump")
        dump.mkdir()
        env = dict(os.environ, IGC_ShaderDumpEnable="1", IGC_DumpToCustomDir=str(dump))
        cmd = [
            str(ocloc_path()),
            "compile",
            "-file",
            str(src),
            "-spirv_input",
            "-device",
            TARGETS[target].device,
            "-output",
            str(Path(tmp, "kernel")),
            "-options",
            flags,
        ]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"ocloc exit {proc.returncode}: {log.strip()[-200:]}")
        asm = final_asm(glob.glob(str(dump / "*_simd*_entry_*.asm")))
        return log, (Path(asm).read_text(errors="replace") if asm else None)


def compile_one(spec: Any, target: str) -> Resources:
    """Compile ``spec`` for ``target`` and measure it (errors become a failing row, not an exception)."""
    try:
        spirv, flags = compile_spirv(spec, target)
    except Exception as exc:  # reported as a failing row
        return Resources(spec.label, target, "-", "-", 0, f"error: triton: {type(exc).__name__}: {str(exc)[:160]}")
    try:
        log, asm = run_ocloc(spirv, target, flags)
    except Exception as exc:  # likewise
        return Resources(spec.label, target, grf_mode(flags), "-", 0, f"error: {type(exc).__name__}: {str(exc)[:160]}")
    return measure(spec.label, target, flags, log, asm)


def _compile_star(args: tuple[Any, str]) -> Resources:
    return compile_one(*args)


def run_checks(jobs: Sequence[tuple[Any, str]], workers: int) -> list[Resources]:
    """Compile every (specialization, target) pair, in ``workers`` processes."""
    if workers <= 1:
        return [compile_one(s, t) for s, t in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_compile_star, jobs, chunksize=2))


def render(rows: Sequence[Resources]) -> list[str]:
    """The report table (markdown), one line per kernel and target."""
    lines = [
        "| kernel | target | GRF mode | registers (used/available) | spills | status |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        status = "ok" if r.ok else f"FAIL {r.note}".strip()
        lines.append(f"| {r.label} | {r.target} | {r.grf_mode} | {r.registers} | {r.spills} | {status} |")
    return lines


def summarize(rows: Sequence[Resources], kinds: int, targets: int, seconds: float) -> str:
    """One line: counts, register range, failures and time."""
    used = [int(r.registers.split("/")[0]) for r in rows if re.fullmatch(r"\d+/\d+", r.registers)]
    span = f"registers {min(used)}-{max(used)} used" if used else "no register counts"
    bad = [r for r in rows if not r.ok]
    spilled = sum(1 for r in rows if r.spills)
    errors = sum(1 for r in rows if r.note.startswith("error"))
    return (
        f"{len(rows)} kernels ({kinds} specializations, {targets} targets) compiled in {seconds:.0f} s; {span}; "
        f"{spilled} spilling, {errors} compile errors; {len(bad)} failing"
    )


def _capabilities() -> Any:
    from paged_backend_xpu.backend import XpuBackend

    return XpuBackend.capabilities()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: compile, print the table, return 1 on any spill or compile error."""
    parser = argparse.ArgumentParser(
        prog="python -m paged_backend_xpu.aot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of " + ",".join(TARGETS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--match", default="", help="only specializations whose label contains this text")
    parser.add_argument("--output", default=None, help="also write the table to this file")
    ns = parser.parse_args(argv)
    targets = [t for t in ns.targets.split(",") if t]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown} (known: {', '.join(TARGETS)})")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("TRITON_INTERPRET is set: the ahead-of-time check needs triton in compiled mode")
    try:
        ocloc_path()
    except FileNotFoundError as exc:
        parser.error(str(exc))
    import triton  # noqa: F401 (imported first: the launch options' spelling follows its Intel backend)

    from paged_triton.specializations import all_specializations

    specs = [s for s in all_specializations(_capabilities(), "xpu") if ns.match in s.label]
    jobs = sorted(((s, t) for t in targets for s in specs), key=lambda job: (job[0].label, job[1]))
    start = time.monotonic()
    rows = run_checks(jobs, ns.workers)
    lines = render(rows)
    summary = summarize(rows, len(specs), len(targets), time.monotonic() - start)
    print("\n".join(lines))
    print(summary)
    if ns.output:
        Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.output).write_text("\n".join([*lines, "", summary, ""]))
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
