"""Micro-benchmark: one scheduling step plus its update, at N running decode requests.

Prints microseconds per request per step (median over steps). Not a test:
these machines are shared, so read the figure, don't assert on it.

    python benchmarks/scheduler_step.py --running 256 1024
"""

from __future__ import annotations

import argparse
import statistics
import time

from paged_core.config import CacheConfig, SchedulerConfig
from paged_core.sched.request import Request
from paged_core.sched.scheduler import Scheduler


def measure(num_running: int, steps: int, block_size: int, prompt_len: int) -> dict[str, float]:
    blocks_per_req = (prompt_len + steps + 8) // block_size + 2
    sched = Scheduler(
        SchedulerConfig(
            max_model_len=8192, max_num_batched_tokens=max(8192, num_running * prompt_len), max_num_seqs=num_running
        ),
        CacheConfig(num_blocks=num_running * blocks_per_req + 1, block_size=block_size),
    )
    for i in range(num_running):
        # Distinct prompts: no prefix sharing, the plain decode path.
        sched.add_request(Request(f"r{i}", [i + 1] * prompt_len, max_tokens=steps + 10, ignore_eos=True))
    out = sched.schedule()  # the prefill step
    sched.update_from_output(out, {rid: [1] for rid in out.num_scheduled_tokens})
    assert sched.num_running == num_running
    sample = [2]
    sched_times, update_times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        sampled = dict.fromkeys(out.num_scheduled_tokens, sample)
        t2 = time.perf_counter()
        sched.update_from_output(out, sampled)
        t3 = time.perf_counter()
        sched_times.append(t1 - t0)
        update_times.append(t3 - t2)
    s = statistics.median(sched_times) * 1e6 / num_running
    u = statistics.median(update_times) * 1e6 / num_running
    return {"schedule_us": s, "update_us": u, "total_us": s + u}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=100)
    a = p.parse_args()
    print(f"{'running':>8} {'schedule':>10} {'update':>10} {'total':>10}  (us per request per step, median)")
    for n in a.running:
        r = measure(n, a.steps, a.block_size, a.prompt_len)
        print(f"{n:>8} {r['schedule_us']:>10.3f} {r['update_us']:>10.3f} {r['total_us']:>10.3f}")


if __name__ == "__main__":
    main()
