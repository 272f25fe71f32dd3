"""The captured step reads metadata only on the device (only when graph capture is declared).

A device graph records kernels, not Python: a step that reads a metadata
tensor on the host (``.item()``, ``.tolist()``, ``int()``, a branch on a
value) runs fine eagerly and under ``torch.compile`` with graph breaks, but a
CUDA/HIP/XPU graph freezes the capture-time value. Tracing the runner's step
with ``torch.compile(fullgraph=True)`` turns every such read that steers
the computation into an error, with no device needed; an eager run under a
torch-function mode also catches reads whose result the compiler would
drop as dead code (both in :mod:`paged_conformance.tracing`).
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest
import torch

from paged_conformance.batch import make_batch
from paged_conformance.graphs import attention_runner, graph_case
from paged_conformance.session import Conformance
from paged_conformance.tracing import HostReads, first_line, own_entry
from paged_core.api import EagerStrategy, StepFn

TRACE_SIZE = 2
"""Decode rows in the traced step."""


class RecordingStrategy(EagerStrategy):
    """Eager replay that also keeps each captured step and its static arguments for tracing."""

    name = "conformance-recording"

    def __init__(self) -> None:
        super().__init__()
        self.recorded: dict[Hashable, tuple[StepFn, tuple[torch.Tensor, ...]]] = {}

    def capture(self, key: Hashable, fn: StepFn, args: tuple[torch.Tensor, ...]) -> None:
        super().capture(key, fn, args)
        self.recorded[key] = (fn, args)


@pytest.mark.paged_capability("graph")
def test_graph_step_has_no_host_reads(conformance: Conformance) -> None:
    """The uniform-decode step the runner captures compiles with ``fullgraph=True`` (no graph break)."""
    case = graph_case(conformance, "block+1")
    batch = make_batch(case, rows=[(1, case.block_size + 1), (1, 2 * case.block_size + 3)])
    spec = batch.spec
    backend = conformance.backend()
    cache = backend.allocate_kv_cache(batch.num_blocks, case.block_size, spec, case.dtype)
    recorder = RecordingStrategy()
    runner = attention_runner(
        backend,
        cache,
        spec,
        case,
        max_blocks_per_seq=batch.max_blocks,
        capture_sizes=(TRACE_SIZE,),
        strategy=recorder,
        warmup_iters=1,
    )
    runner.capture_all()
    md = batch.metadata(backend.device)
    q, k, v = batch.step_tensors(backend.device)
    runner.run(md, query=q, key=k, value=v)  # fills the static buffers with a real batch
    assert TRACE_SIZE in recorder.recorded, "the runner captured no step for a uniform decode batch"
    fn, args = recorder.recorded[TRACE_SIZE]
    try:
        torch.compile(own_entry(fn), backend="eager", fullgraph=True, dynamic=False)(*args)
    except Exception as exc:
        raise AssertionError(
            "the captured decode step does not trace as one graph (torch.compile fullgraph=True): "
            f"{first_line(exc)}. A host-side read of metadata (.item(), .tolist(), int(), a Python "
            "branch on a tensor value) would be frozen into a device graph at capture time."
        ) from None
    with HostReads() as reads:
        fn(*args)
    if reads.seen:
        raise AssertionError(
            f"the captured decode step reads tensors on the host ({', '.join(dict.fromkeys(reads.seen))}): "
            "a device graph would freeze the values seen at capture time"
        )
