"""The shared Triton multi-LoRA kernels on a GPU: correctness against the contract's reference, graph capture,
and time per call against the reference's per-slot grouping (torch on the same GPU).

Shapes: SmolLM2-135M's MLP (``K`` 576, ``N`` 1,728, the issue's figure) and a 7-8B model's merged q/k/v
(``K`` 4,096, ``N`` 6,144), ``S`` = 4 slots, ``R`` = 48 (three parts of rank 16), at ``T`` = 1, 16, 17, 256,
2,048 and 8,192 tokens in fp32, bf16 and fp16; slots ``scattered`` (drawn per token from -1..3) or ``runs``
(five contiguous groups). Times are ``triton.testing.do_bench`` medians in microseconds. Then one CUDA graph
holding shrink + expand is captured and replayed with other slots and inputs copied in (the launches read no
value on the host, so the replay must follow the new slots).

    PYTHONPATH=core/src:backends/triton/src python3 benchmarks/lora_triton.py
"""

from __future__ import annotations

import torch
import triton.testing

from paged_core.api import FusedOps
from paged_triton import lora_launch
from paged_triton.fused import TritonFusedOps

S, R = 4, 48
SHAPES = {"smollm2_mlp": (576, 1728), "8b_qkv": (4096, 6144)}
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def slots_for(pattern: str, tokens: int, gen: torch.Generator) -> torch.Tensor:
    if pattern == "scattered" or tokens < S + 1:
        return torch.randint(-1, S, (tokens,), generator=gen)
    cuts = sorted(torch.randperm(tokens - 1, generator=gen)[:S].add(1).tolist())
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]
    order = torch.randperm(S + 1, generator=gen).sub(1).tolist()
    return torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in zip(order, sizes, strict=True)])


def main() -> None:
    dev = torch.device("cuda")
    ref, ops = FusedOps(), TritonFusedOps()
    gen = torch.Generator().manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    print(
        "{:12} {:9} {:>5} {:9} {:>10} {:>7} {:>10} {:>7}".format(
            "shape", "dtype", "T", "slots", "shrink ref", "triton", "expand ref", "triton"
        )
    )
    for name, (k, n) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = (torch.randn(S, R, k, generator=gen) / k**0.5).to(dev, dtype)
            b = (torch.randn(S, n, R, generator=gen) / R**0.5).to(dev, dtype)
            for tokens in (1, 16, 17, 256, 2048, 8192):
                for pattern in ("scattered", "runs") if tokens > 1 else ("scattered",):
                    x = torch.randn(tokens, k, generator=gen).to(dev, dtype)
                    y = torch.randn(tokens, n, generator=gen).to(dev, dtype)
                    slots = slots_for(pattern, tokens, gen).to(dev)
                    want = ref.lora_shrink(x, a, slots)
                    got = ops.lora_shrink(x, a, slots)
                    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
                    want_y = ref.lora_expand(y.clone(), want, b, slots)
                    got_y = ops.lora_expand(y.clone(), want, b, slots)
                    torch.testing.assert_close(got_y, want_y, rtol=TOL[dtype], atol=TOL[dtype])
                    ys = y.clone()
                    t = [
                        triton.testing.do_bench(lambda: ref.lora_shrink(x, a, slots)) * 1e3,  # noqa: B023
                        triton.testing.do_bench(lambda: ops.lora_shrink(x, a, slots)) * 1e3,  # noqa: B023
                        triton.testing.do_bench(lambda: ref.lora_expand(ys, want, b, slots)) * 1e3,  # noqa: B023
                        triton.testing.do_bench(lambda: ops.lora_expand(ys, want, b, slots)) * 1e3,  # noqa: B023
                    ]
                    dt = str(dtype).removeprefix("torch.")
                    print(
                        f"{name:12} {dt:9} {tokens:>5} {pattern:9} {t[0]:>10.1f} {t[1]:>7.1f}"
                        f" {t[2]:>10.1f} {t[3]:>7.1f}",
                        flush=True,
                    )
    # Graph capture: one graph, replayed with other slots (both forms: 8 tokens per token, 64 sorted).
    for tokens in (8, 64):
        k, n = SHAPES["smollm2_mlp"]
        a = (torch.randn(S, R, k, generator=gen) / k**0.5).to(dev, torch.bfloat16)
        b = (torch.randn(S, n, R, generator=gen) / R**0.5).to(dev, torch.bfloat16)
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        y = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        slots = torch.randint(-1, S, (tokens,), device=dev)
        ops.lora_expand(y.clone(), ops.lora_shrink(x, a, slots), b, slots)  # compile outside the capture
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            ops.lora_expand(y, ops.lora_shrink(x, a, slots), b, slots)
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(3):
            new_x, new_y = torch.randn_like(x), torch.randn_like(y)
            new_slots = torch.randint(-1, S, (tokens,), device=dev)
            x.copy_(new_x)
            y.copy_(new_y)
            slots.copy_(new_slots)
            graph.replay()
            torch.cuda.synchronize()
            want_y = ref.lora_expand(new_y.clone(), ref.lora_shrink(new_x, a, new_slots), b, new_slots)
            torch.testing.assert_close(y, want_y, rtol=3e-2, atol=3e-2)
        print(f"graph replay T={tokens}: 3 replays with new slots match the reference")
    # Expand's tiles (sorted form), and the 16-bit dot it does not use by default, on the 8B shape.
    k, n = SHAPES["8b_qkv"]
    for dtype in (torch.bfloat16, torch.float32):
        b = (torch.randn(S, n, R, generator=gen) / R**0.5).to(dev, dtype)
        for tokens in (2048, 8192):
            y = torch.randn(tokens, n, device=dev, dtype=dtype)
            shrunk = torch.randn(tokens, R, device=dev)
            slots = slots_for("runs", tokens, gen).to(dev)
            want_y = ref.lora_expand(y.clone(), shrunk, b, slots)
            for block_t, block_n, half in ((32, 64, False), (64, 64, False), (64, 128, False), (128, 64, False),
                                           (32, 64, True), (64, 128, True), (128, 128, True)):  # fmt: skip
                lora_launch.BLOCK_T, lora_launch.BLOCK_OUT, lora_launch.EXPAND_HALF_DOT = block_t, block_n, half
                torch.testing.assert_close(ops.lora_expand(y.clone(), shrunk, b, slots), want_y, rtol=3e-2, atol=3e-2)
                ys = y.clone()
                us = triton.testing.do_bench(lambda: ops.lora_expand(ys, shrunk, b, slots)) * 1e3  # noqa: B023
                print(
                    f"expand 8b_qkv {str(dtype)[6:]} T={tokens} BLOCK_T={block_t} BLOCK_N={block_n} half={half}:"
                    f" {us:.1f} us"
                )
    print("ALL OK")


if __name__ == "__main__":
    main()
