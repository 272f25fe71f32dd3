"""Ahead-of-time check: compile every specialization for AMD and NVIDIA targets, no GPU needed.

``python -m paged_backend_rocm.aot`` prints one row per (kernel, target) with registers, spills and
shared/LDS bytes, and exits 1 on any spill (VGPR/SGPR spills or scratch on AMD, spill stores/loads on
NVIDIA) or on shared memory above the target's per-workgroup limit. Must run in a process where triton
is in compiled mode (``TRITON_INTERPRET`` unset).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from paged_triton.specializations import Specialization, all_specializations
from paged_triton.tiles import num_warps

TARGETS: dict[str, tuple[str, int | str, int, int, str]] = {
    # name: (backend, arch, warp size, shared memory / LDS bytes per workgroup, tile family)
    "gfx942": ("hip", "gfx942", 64, 64 * 1024, "cdna"),  # MI300X
    "gfx90a": ("hip", "gfx90a", 64, 64 * 1024, "cdna"),  # MI250X
    "gfx1100": ("hip", "gfx1100", 32, 64 * 1024, "rdna"),  # RX 7900 XTX (64 KiB per workgroup)
    "sm90": ("cuda", 90, 32, 227 * 1024, "nvidia"),  # H100/H200 (opt-in maximum per block)
}


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses on one target."""

    label: str
    target: str
    registers: str
    spills: int
    shared: int
    limit: int
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.spills == 0 and self.shared <= self.limit and not self.note.startswith("error")


def _field(text: str, name: str) -> int:
    match = re.search(rf"^\s*\.{name}:\s*(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _amd(asm: str) -> tuple[str, int, str]:
    """(registers, spills, note) from AMDGPU assembly metadata."""
    vgpr, sgpr = _field(asm, "vgpr_count"), _field(asm, "sgpr_count")
    v_spill, s_spill = _field(asm, "vgpr_spill_count"), _field(asm, "sgpr_spill_count")
    scratch = re.search(r"; ScratchSize: (\d+)", asm)
    scratch_bytes = int(scratch.group(1)) if scratch else 0
    note = f"vgpr spill {v_spill}, sgpr spill {s_spill}, scratch {scratch_bytes} B" if v_spill + s_spill else ""
    return f"{vgpr} v / {sgpr} s", v_spill + s_spill + scratch_bytes, note


def _nvidia(ptxas_log: str) -> tuple[str, int, str]:
    """(registers, spill bytes, note) from the ``ptxas -v`` log of the compile triton itself ran."""
    regs = re.search(r"Used (\d+) registers", ptxas_log)
    stores = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", ptxas_log))
    loads = sum(int(n) for n in re.findall(r"(\d+) bytes spill loads", ptxas_log))
    if regs is None:
        return "?", 1, "error: no ptxas -v log captured"
    return regs.group(1), stores + loads, (f"spill stores {stores} B, loads {loads} B" if stores + loads else "")


def compile_one(spec: Specialization, target: str) -> Resources:
    """Compile ``spec`` for ``target`` and measure it (errors become a failing row, not an exception)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from paged_triton.launch import kernel_set

    backend, arch, warp, limit, _ = TARGETS[target]
    fn = getattr(kernel_set(), spec.kernel)
    source = ASTSource(fn, spec.signature(list(fn.arg_names)), dict(spec.constexprs))
    log = io.StringIO()
    try:
        options: dict[str, object] = {"num_warps": num_warps(spec.lanes, warp), **dict(spec.options)}
        # Triton runs ptxas -v itself and prints its log when asked: the numbers of the real compile.
        # (always_compile: a cached kernel would skip ptxas and leave no log).
        with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True
            knobs.compilation.always_compile = backend == "cuda"
            kernel = triton.compile(source, target=GPUTarget(backend, arch, warp), options=options)
    except Exception as exc:
        return Resources(spec.label, target, "-", 0, 0, limit, f"error: {type(exc).__name__}: {str(exc)[:120]}")
    shared = int(kernel.metadata.shared)
    regs, spills, note = _amd(kernel.asm["amdgcn"]) if backend == "hip" else _nvidia(log.getvalue())
    return Resources(spec.label, target, regs, spills, shared, limit, note)


def _compile_star(args: tuple[Specialization, str]) -> Resources:
    return compile_one(*args)


def run_checks(jobs: Sequence[tuple[Specialization, str]], workers: int) -> list[Resources]:
    """Compile every (specialization, target) pair, in ``workers`` processes."""
    if workers <= 1:
        return [compile_one(s, t) for s, t in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_compile_star, jobs, chunksize=4))


def render(rows: Sequence[Resources]) -> list[str]:
    """The report table (markdown), one line per kernel and target."""
    lines = [
        "| kernel | target | registers | spills | shared/LDS bytes (limit) | status |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        status = "ok" if r.ok else f"FAIL {r.note}".strip()
        lines.append(f"| {r.label} | {r.target} | {r.registers} | {r.spills} | {r.shared} ({r.limit}) | {status} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: compile, print the table, return 1 on any spill, overflow or compile error."""
    parser = argparse.ArgumentParser(prog="python -m paged_backend_rocm.aot", description=__doc__)
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
    from paged_backend_rocm.backend import RocmBackend

    caps = RocmBackend.capabilities()
    jobs = [(s, t) for t in targets for s in all_specializations(caps, TARGETS[t][4]) if ns.match in s.label]
    jobs.sort(key=lambda job: (job[0].label, job[1]))
    start = time.monotonic()
    rows = run_checks(jobs, ns.workers)
    lines = render(rows)
    bad = [r for r in rows if not r.ok]
    kinds = len({job[0].label for job in jobs})
    summary = (
        f"{len(rows)} kernels ({kinds} specializations, {len(targets)} targets) compiled in "
        f"{time.monotonic() - start:.0f} s; {len(bad)} failing (spill, LDS over limit or compile error)"
    )
    print("\n".join(lines))
    print(summary)
    if ns.output:
        Path(ns.output).write_text("\n".join([*lines, "", summary, ""]))
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
