"""The resource report: every kernel compiled for every architecture, no GPU needed.

``python -m paged_backend_cuda.resources`` compiles each kernel source for each SASS target with
``nvcc --resource-usage`` (ptxas's own numbers for the real compile), prints one row per (kernel, target) with
registers, spill bytes, stack (local memory) and static shared memory, and exits 1 if any kernel spills, uses
local memory or needs more shared memory than a block may have statically (48 KiB on every target).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from paged_backend_cuda import build

STATIC_SHARED_LIMIT = 48 * 1024
"""Static shared memory a thread block may declare on sm_80-sm_90 (more needs the dynamic opt-in)."""
REGISTER_LIMIT = 255


@dataclass(frozen=True)
class Usage:
    """What ptxas reports for one kernel on one target."""

    kernel: str
    target: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int

    @property
    def problems(self) -> list[str]:
        """Everything wrong with this kernel (empty when it is fine)."""
        out = []
        if self.spill_stores or self.spill_loads:
            out.append(f"spills {self.spill_stores} B stored, {self.spill_loads} B loaded")
        if self.stack:
            out.append(f"{self.stack} B of stack (local memory)")
        if self.shared > STATIC_SHARED_LIMIT:
            out.append(f"{self.shared} B shared memory > {STATIC_SHARED_LIMIT}")
        if self.registers > REGISTER_LIMIT:
            out.append(f"{self.registers} registers")
        return out


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {n: n for n in names}
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    plain = done.stdout.splitlines()
    return dict(zip(names, plain, strict=True)) if len(plain) == len(names) else {n: n for n in names}


def _short(signature: str) -> str:
    """``void paged_cuda::attention_kernel<float, 64, 1>(...)`` -> ``attention_kernel<float, 64, 1>``."""
    head = signature.split("(")[0].removeprefix("void ").replace("paged_cuda::", "")
    return head.replace("__nv_bfloat16", "bf16").replace("__half", "fp16").replace("float", "fp32")


def parse(log: str) -> list[Usage]:
    """Usages from a ``ptxas -v`` log (one entry per 'Compiling entry function' section)."""
    sections = _ENTRY.split(log)
    raw = []
    for i in range(1, len(sections) - 2, 3):
        name, target, body = sections[i], sections[i + 1], sections[i + 2]

        def num(pattern: str, text: str = body) -> int:
            found = re.search(pattern, text)
            return int(found.group(1)) if found else 0

        counts = (
            num(r"Used (\d+) registers"),
            num(r"(\d+) bytes spill stores"),
            num(r"(\d+) bytes spill loads"),
            num(r"(\d+) bytes stack frame"),
            num(r"(\d+) bytes smem"),
        )
        raw.append((name, target, *counts))
    names = _demangle(sorted({r[0] for r in raw}))
    return [Usage(_short(names[r[0]]), r[1].removeprefix("sm_"), *r[2:]) for r in raw]


def compile_report(source: str, arch: str, nvcc: Path) -> list[Usage]:
    """Compile one source for one SASS target and return its kernels' usage."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(nvcc),
            *build.NVCC_FLAGS,
            f"-arch=sm_{arch}",
            "--resource-usage",
            "-cubin",
            str(build.csrc() / source),
            "-o",
            str(Path(tmp) / "k.cubin"),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    usages = parse(done.stdout + done.stderr)
    if not usages:
        raise RuntimeError(f"no ptxas report for {source} on sm_{arch}")
    return usages


def render(rows: Sequence[Usage]) -> list[str]:
    """The full table (markdown), one row per kernel and target."""
    lines = [
        "| kernel | target | registers | spill bytes (stores/loads) | stack B | static shared B | status |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for u in rows:
        status = "ok" if not u.problems else "FAIL " + "; ".join(u.problems)
        lines.append(
            f"| {u.kernel} | sm_{u.target} | {u.registers} | {u.spill_stores}/{u.spill_loads} | {u.stack} | "
            f"{u.shared} | {status} |"
        )
    return lines


def summarize(rows: Sequence[Usage]) -> list[str]:
    """One row per kernel family and target: how many, register range, most shared memory, total spills."""
    groups: dict[tuple[str, str], list[Usage]] = {}
    for u in rows:
        groups.setdefault((u.kernel.split("<")[0], u.target), []).append(u)
    lines = [
        "| kernel family | target | kernels | registers (min-max) | spill bytes | stack B | max static shared B |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (family, target), us in sorted(groups.items()):
        regs = [u.registers for u in us]
        spills = sum(u.spill_stores + u.spill_loads for u in us)
        lines.append(
            f"| {family} | sm_{target} | {len(us)} | {min(regs)}-{max(regs)} | {spills} | "
            f"{sum(u.stack for u in us)} | {max(u.shared for u in us)} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: compile everything, print the summary, write the tables; 1 on any problem."""
    parser = argparse.ArgumentParser(prog="python -m paged_backend_cuda.resources", description=__doc__)
    parser.add_argument("--arch", default=",".join(build.ARCHITECTURES), help="comma-separated SASS targets")
    parser.add_argument("--workers", type=int, default=2, help="compiles in parallel")
    parser.add_argument("--output", default=None, help="write the full table (markdown) here")
    ns = parser.parse_args(argv)
    nvcc = build.find_nvcc()
    if nvcc is None:
        print("resources: no nvcc found (set CUDA_HOME or PAGED_CUDA_NVCC)", file=sys.stderr)
        return 2
    archs = [a for a in ns.arch.split(",") if a]
    jobs = [(s, a) for a in archs for s in build.KERNEL_SOURCES]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, ns.workers)) as pool:
        results = list(pool.map(lambda job: compile_report(job[0], job[1], nvcc), jobs))
    rows = sorted((u for r in results for u in r), key=lambda u: (u.kernel, u.target))
    bad = [u for u in rows if u.problems]
    summary = (
        f"{len(rows)} kernels ({len(rows) // max(len(archs), 1)} per target x {len(archs)} targets: "
        f"{', '.join('sm_' + a for a in archs)}) compiled in {time.monotonic() - start:.0f} s; "
        f"{len(bad)} with spills, local memory or shared memory over the limit"
    )
    print("\n".join(summarize(rows)))
    print("\n".join(line for line in render(bad)[2:]))
    print(summary)
    if ns.output:
        Path(ns.output).write_text(
            "\n".join(["# Resource report", "", *summarize(rows), "", *render(rows), "", summary, ""])
        )
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
