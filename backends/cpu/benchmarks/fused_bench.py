"""Layer-op benchmark for paged-backend-cpu's CpuFusedOps (a script, not a test).

At the embedded model's shapes (SmolLM2-135M: hidden 576, intermediate 1536, 9 query
heads and 3 KV heads of 64), for T tokens, it times one call of each layer op as

* ``cpu``: the backend's C++ op (:class:`paged_backend_cpu.CpuFusedOps`),
* ``reference``: the pure-torch :class:`paged_core.api.FusedOps` the engine falls back to,
* ``hf``: the unfused torch sequence a transformers Llama layer issues for the same work
  (rms_norm: to(float32), pow, mean, add, rsqrt, mul, to, mul; the residual add before it;
  silu(gate) * up in the model dtype; q * cos + rotate_half(q) * sin for q and k, with cos
  and sin already gathered, as transformers does once per step; for ``rotate_heads``, which
  transformers has not, ``q @ R`` in the model dtype),

and, with ``--linear``, the native linear against ``torch.nn.functional.linear`` for
row counts across the crossover on every projection of the model.

``--quant`` times the packed-weight linear (``CpuFusedOps.linear`` on a
``QuantizedWeight``, the kernel reading the packed bytes in place) per format,
projection and row count: the packed bytes read per second, their share of the
copy bandwidth measured in the same run (a 256 MB tensor copy, read + write bytes
per second, as kernel_bench.py does) and of the read bandwidth (a 256 MB tensor
summed: read bytes per second), and the time of the dense fp32 path
(``CpuFusedOps.linear`` on the dequantized fp32 weight: the native kernel up to its
rows, oneDNN's prepacked matmul above) against it. Weights are cold: each call
reads the next of enough copies to fill ``--cold-mb`` (default 128 MB, four times
the L3 of the development machine), as a model's layers follow each other, for
both paths.

Each figure is the median of ``--runs`` timings taken in turn with the other columns
of its row, each the median over ``--rounds`` rounds of the mean of a batch of calls
(a round lasts about ``--round-ms``): on a shared machine, read the ratios.

    python backends/cpu/benchmarks/fused_bench.py [--tokens 1 64 512] [--dtypes float32 bfloat16]
        [--threads N] [--linear] [--rows 1 2 4 8 16 32 64 128 256 512]
        [--quant [--formats q4_0 q8_0 int8] [--quant-rows 1 4 8 16 32 64 512] [--cold-mb 128]]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from paged_backend_cpu import CpuFusedOps, fused, ops
from paged_core.api import LINEAR_FORMATS as FORMATS
from paged_core.api import FusedOps, PackedLinear, head_rotation
from paged_core.testing import dequantize, random_packed

HIDDEN, INTER, HEADS, KV_HEADS, HEAD = 576, 1536, 9, 3, 64
EPS = 1e-5
LINEARS = {
    "qkv 576->960": (960, 576),
    "o_proj 576->576": (576, 576),
    "gate_up 576->3072": (3072, 576),
    "down 1536->576": (576, 1536),
    "lm_head 576->49152": (49152, 576),
}


QUANT_LINEARS = {
    "q/o 576->576": (576, 576),
    "k/v 576->192": (192, 576),
    "gate_up 576->3072": (3072, 576),
    "down 1536->576": (576, 1536),
    "lm_head 576->49152": (49152, 576),
}
"""The embedded model's projections as the packed formats meet them (q, k, v and o apart, gate/up merged)."""


BEST = False
"""``--best``: every figure is the fastest round instead of the median (on a machine shared with other
work, the least disturbed estimate of what the code does alone)."""


def timed(fn: Callable[[], object], rounds: int, round_ms: float) -> float:
    """Median (``--best``: minimum) over ``rounds`` of the mean seconds per call in a round of about ``round_ms``."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(round_ms / 1e3 / once))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return min(samples) if BEST else statistics.median(samples)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + EPS)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def op_cases(tokens: int, dtype: torch.dtype) -> dict[str, dict[str, Callable[[], object]]]:
    """For each op, the callables to time: cpu, reference and the transformers sequence."""
    gen = torch.Generator().manual_seed(tokens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    cpu, ref = CpuFusedOps(), FusedOps()
    x, res, w = rand(tokens, HIDDEN), rand(tokens, HIDDEN), rand(HIDDEN)
    gate_up = rand(tokens, 2 * INTER)
    qkv = rand(tokens, (HEADS + 2 * KV_HEADS) * HEAD)
    q = qkv[:, : HEADS * HEAD].view(tokens, HEADS, HEAD)
    k = qkv[:, HEADS * HEAD : (HEADS + KV_HEADS) * HEAD].view(tokens, KV_HEADS, HEAD)
    positions = torch.randint(0, 8192, (tokens,), generator=gen)
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, HEAD, 2, dtype=torch.float32) / HEAD))
    angles = torch.arange(8192, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    cos = torch.cat([angles.cos(), angles.cos()], -1)[positions][:, None, :].to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[positions][:, None, :].to(dtype)

    rotation = head_rotation(HEAD).to(dtype)

    def hf_silu() -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def hf_rotary() -> tuple[torch.Tensor, torch.Tensor]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    return {
        "rms_norm": {
            "cpu": lambda: cpu.rms_norm(x, w, EPS),
            "reference": lambda: ref.rms_norm(x, w, EPS),
            "hf": lambda: hf_rms_norm(x, w),
        },
        "add_rms_norm": {
            "cpu": lambda: cpu.add_rms_norm(x, res, w, EPS),
            "reference": lambda: ref.add_rms_norm(x, res, w, EPS),
            "hf": lambda: hf_rms_norm(res + x, w),
        },
        "silu_and_mul": {
            "cpu": lambda: cpu.silu_and_mul(gate_up),
            "reference": lambda: ref.silu_and_mul(gate_up),
            "hf": hf_silu,
        },
        "rotary": {
            "cpu": lambda: cpu.rotary(positions, q, k, cache),
            "reference": lambda: ref.rotary(positions, q, k, cache),
            "hf": hf_rotary,
        },
        "rotate_heads": {
            "cpu": lambda: cpu.rotate_heads(q),
            "reference": lambda: ref.rotate_heads(q),
            "hf": lambda: q @ rotation,
        },
    }


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}" if seconds < 1e-4 else f"{seconds * 1e6:.0f}"


def interleaved(impls: dict[str, Callable[[], object]], runs: int, rounds: int, round_ms: float) -> dict[str, float]:
    """Median (``--best``: minimum) of ``runs`` timings of each callable, taken in turn (load drift hits every one
    alike)."""
    samples: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(runs):
        for name, fn in impls.items():
            samples[name].append(timed(fn, rounds, round_ms))
    return {name: min(s) if BEST else statistics.median(s) for name, s in samples.items()}


def bench_ops(tokens_list: list[int], dtypes: list[torch.dtype], runs: int, rounds: int, round_ms: float) -> None:
    print("| op | dtype | T | cpu (us) | reference (us) | transformers sequence (us) | reference / cpu | hf / cpu |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in dtypes:
        for tokens in tokens_list:
            for op, impls in op_cases(tokens, dtype).items():
                t = interleaved(impls, runs, rounds, round_ms)
                print(
                    f"| {op} | {str(dtype).removeprefix('torch.')} | {tokens} | {us(t['cpu'])} | {us(t['reference'])} "
                    f"| {us(t['hf'])} | {t['reference'] / t['cpu']:.1f}x | {t['hf'] / t['cpu']:.1f}x |",
                    flush=True,
                )


def bench_linear(rows_list: list[int], dtypes: list[torch.dtype], runs: int, rounds: int, round_ms: float) -> None:
    """Native kernel against torch's linear; lm_head only up to 32 rows (torch's bf16 takes seconds beyond)."""
    print("| projection | dtype | " + " | ".join(f"M={m}" for m in rows_list) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in rows_list) + " |")
    for dtype in dtypes:
        for name, (n, k) in LINEARS.items():
            gen = torch.Generator().manual_seed(n)
            w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
            packed = ops.pack_linear(w)
            cells = []
            for m in rows_list:
                if n > 10_000 and m > 32:
                    cells.append("-")
                    continue
                x = torch.randn(m, k, generator=gen).to(dtype)
                t = interleaved(
                    {
                        "native": lambda x=x, p=packed, n=n: ops.linear(x, p, None, n),
                        "torch": lambda x=x, w=w: F.linear(x, w),
                    },
                    runs,
                    rounds,
                    round_ms,
                )
                native, torch_s = t["native"], t["torch"]
                cells.append(f"{us(native)} / {us(torch_s)} ({torch_s / native:.1f}x)")
            print(f"| {name} | {str(dtype).removeprefix('torch.')} | " + " | ".join(cells) + " |", flush=True)


def copy_bandwidth(mbytes: int = 256) -> float:
    """Bytes per second moved (read + written) by copying a ``mbytes`` MB tensor with torch's threads (best of 5)."""
    src = torch.ones(mbytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def read_bandwidth(mbytes: int = 256) -> float:
    """Bytes per second read by summing a ``mbytes`` MB fp32 tensor with torch's threads (best of 5)."""
    src = torch.ones(mbytes * 2**20 // 4)
    src.sum()
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best


class Cycle:
    """Calls ``fn(item)`` for the next of ``items`` each time (cold weights: each call reads another copy)."""

    def __init__(self, fn: Callable[[object], object], items: list[object]) -> None:
        self.fn, self.items, self.i = fn, items, 0

    def __call__(self) -> object:
        self.i = (self.i + 1) % len(self.items)
        return self.fn(self.items[self.i])


def bench_quant(
    formats: list[str], rows_list: list[int], cold_mb: int, runs: int, rounds: int, round_ms: float
) -> None:
    """Packed linear per format, projection and M: packed GB/s, share of copy bandwidth, time vs dense fp32."""
    copy_bw, read_bw = copy_bandwidth(), read_bandwidth()
    cpu = CpuFusedOps()
    print(
        f"copy bandwidth (256 MB tensor copy, read + write): {copy_bw / 1e9:.1f} GB/s; read bandwidth (sum of a "
        f"256 MB tensor): {read_bw / 1e9:.1f} GB/s; "
        f"streaming up to {cpu.quant_stream_rows} rows, activations there {ops.linear_activations()} (q4_0, q4_1, "
        f"q8_0; kernels {ops.quant_q8_isa()}); cold weights: {cold_mb} MB of copies per path; "
        f"{'fastest' if BEST else 'median'} timings"
    )
    print(
        "| format | projection | M | packed | packed (us) | packed GB/s | of copy | of read | dense fp32 (us) "
        "| dense / packed |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fmt in formats:
        for name, (n, k) in QUANT_LINEARS.items():
            if k % FORMATS[fmt].block_size:  # q4_k, q6_k: blocks of 256 (the embedded model's 576 is not)
                continue
            gen = torch.Generator().manual_seed(n + k)
            w = random_packed(FORMATS[fmt], n, k, gen)
            copies = max(1, math.ceil(cold_mb * 2**20 / w.nbytes))
            packs: list[object] = [cpu.pack_linear(w)]
            packs += [cpu.pack_linear(random_packed(FORMATS[fmt], n, k, gen)) for _ in range(copies - 1)]
            dense_w = dequantize(w)
            dense_copies = max(1, math.ceil(cold_mb * 2**20 / (dense_w.numel() * 4)))
            dense: list[object] = [cpu.pack_linear(dense_w)]
            dense += [cpu.pack_linear(dense_w.clone()) for _ in range(dense_copies - 1)]
            for m in rows_list:
                if n > 10_000 and m > 32:
                    continue
                x = torch.randn(m, k, generator=gen)

                def run(p: object, x: torch.Tensor = x) -> object:
                    assert isinstance(p, PackedLinear)
                    return cpu.linear(x, p)

                t = interleaved({"packed": Cycle(run, packs), "dense": Cycle(run, dense)}, runs, rounds, round_ms)
                gbs = w.nbytes / t["packed"] / 1e9
                print(
                    f"| {fmt} | {name} | {m} | {w.nbytes / 2**20:.2f} MB | {us(t['packed'])} | {gbs:.1f} "
                    f"| {100 * gbs * 1e9 / copy_bw:.0f}% | {100 * gbs * 1e9 / read_bw:.0f}% | {us(t['dense'])} "
                    f"| {t['dense'] / t['packed']:.2f}x |",
                    flush=True,
                )
            del packs, dense
    print(f"at the end: copy {copy_bandwidth() / 1e9:.1f} GB/s, read {read_bandwidth() / 1e9:.1f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--runs", type=int, default=3, help="timings per figure, taken in turn (median)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per timing (median)")
    parser.add_argument("--round-ms", type=float, default=15.0)
    parser.add_argument("--linear", action="store_true", help="also time the native linear against F.linear")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--no-ops", action="store_true", help="skip the element-wise ops")
    parser.add_argument("--quant", action="store_true", help="time the packed-weight linear (implies --no-ops)")
    parser.add_argument("--formats", nargs="+", default=["q4_0", "q8_0", "int8"])
    parser.add_argument("--quant-rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 512])
    parser.add_argument("--best", action="store_true", help="report the fastest timing, not the median")
    parser.add_argument(
        "--activations",
        choices=["int8x2", "int8", "fp32"],
        default=None,
        help="the packed linear's activations at streaming row counts (default: the backend's)",
    )
    parser.add_argument("--cold-mb", type=int, default=128, help="MB of weight copies each path cycles through")
    args = parser.parse_args()
    global BEST
    BEST = args.best
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.activations is not None:
        ops.set_linear_activations(args.activations)
    dtypes = [getattr(torch, d) for d in args.dtypes]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, kernels: {ops.fused_isa()} "
        f"(attention {ops.isa()}), linear kernel up to {fused.default_max_rows()} rows"
    )
    if args.quant:
        bench_quant(args.formats, args.quant_rows, args.cold_mb, args.runs, args.rounds, args.round_ms)
        return
    if not args.no_ops:
        bench_ops(args.tokens, dtypes, args.runs, args.rounds, args.round_ms)
    if args.linear:
        print("\nnative linear / torch F.linear, microseconds (torch / native)")
        bench_linear(args.rows, dtypes, args.runs, args.rounds, args.round_ms)


if __name__ == "__main__":
    main()
