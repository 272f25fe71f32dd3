"""Graph replay through the core's GraphRunner equals eager execution and the oracle (only when declared).

One runner per module captures every size once; each test then replays two
batches of its size, the second in different blocks with different lengths,
so a strategy or backend that froze the capture-time block table or
sequence lengths fails. Row counts between capture sizes exercise padding.
Replays are compared with the oracle too: a bug shared by the eager and
replayed paths would otherwise pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from paged_conformance.batch import Batch, make_batch
from paged_conformance.graphs import attention_runner, graph_case
from paged_conformance.grid import NUM_KV_HEADS, Case, graph_capture_sizes
from paged_conformance.harness import assert_close
from paged_conformance.session import Conformance
from paged_core.api import AttentionBackend, AttentionSpec, GraphSupport
from paged_core.testing import GraphRunner

MAX_BLOCKS_PER_SEQ = 5
CACHE_BLOCKS = 96
# (blocks, extra tokens) per row: seq_len = blocks * block_size + extra.
FIRST_LENGTHS = ((1, 1), (3, 3), (0, 1), (1, -1), (1, 0), (2, 0), (0, 5), (1, 2))
SECOND_LENGTHS = ((2, 5), (0, 2), (1, 0), (3, 0), (1, 3), (0, 7), (1, -1), (0, 1))


@dataclass
class GraphRig:
    """A captured runner and the KV cache its step writes into."""

    backend: AttentionBackend
    runner: GraphRunner
    cache: torch.Tensor
    spec: AttentionSpec
    case: Case
    conformance: Conformance


@pytest.fixture(scope="module")
def graph_rig(conformance: Conformance) -> GraphRig:
    """Capture every graph size once for this module (N/A when capture is not declared)."""
    case = graph_case(conformance, "1")
    spec = AttentionSpec(case.num_heads, NUM_KV_HEADS, case.head_size)
    backend = conformance.backend()
    cache = backend.allocate_kv_cache(CACHE_BLOCKS, case.block_size, spec, case.dtype)
    runner = attention_runner(
        backend,
        cache,
        spec,
        case,
        max_blocks_per_seq=MAX_BLOCKS_PER_SEQ,
        capture_sizes=graph_capture_sizes(conformance.grid),
    )
    runner.capture_all()
    return GraphRig(backend, runner, cache, spec, case, conformance)


def _batch(rig: GraphRig, rows: list[tuple[int, int]], phase: str, offset: int) -> Batch:
    case = dataclasses.replace(rig.case, length=phase)
    batch = make_batch(case, rows=rows, spec=rig.spec, extra_blocks=0)
    tables = [[b + offset for b in t] for t in batch.block_tables]
    assert offset + batch.num_blocks <= CACHE_BLOCKS, "internal: graph rig cache too small"
    return dataclasses.replace(batch, block_tables=tables, num_blocks=offset + batch.num_blocks)


def _replay_and_compare(rig: GraphRig, batch: Batch, phase: str) -> None:
    backend, device = rig.backend, rig.backend.device
    ctx = batch.context_step(device)
    if ctx is not None:
        md, k, v = ctx
        backend.prepare(md)
        backend.write_kv(k, v, rig.cache, md)
    eager_cache = rig.cache.clone()
    md = batch.metadata(device)
    q, k, v = batch.step_tensors(device)
    backend.prepare(md)
    eager = backend.forward(q, k, v, eager_cache, md, rig.spec)[: md.num_actual_tokens]
    before = rig.runner.stats.replays
    out = rig.runner.run(md, query=q, key=k, value=v)
    reasons = dict(rig.runner.stats.fallback_reasons)
    assert rig.runner.stats.replays == before + 1, f"{phase}: batch ran eagerly instead of replaying ({reasons})"
    assert_close(out, eager, batch, f"graph replay ({phase}) vs eager")
    assert_close(out, rig.conformance.expected(batch, rig.spec), batch, f"graph replay ({phase}) vs oracle")
    differ = int((rig.cache != eager_cache).sum())
    assert differ == 0, f"{phase}: KV cache after replay differs from eager in {differ} elements"


@pytest.mark.paged_capability("graph")
@pytest.mark.paged_cases("graph_sizes")
def test_graph_replay_matches_eager(graph_rig: GraphRig, batch_size: int) -> None:
    """Decode batches of ``batch_size`` rows replay equal to eager and the oracle, also after the tables change."""
    rig, block = graph_rig, graph_rig.case.block_size
    rig.cache.zero_()
    first = _batch(rig, [(1, m * block + e) for m, e in FIRST_LENGTHS[:batch_size]], "graph-a", 0)
    _replay_and_compare(rig, first, "first replay")
    second = _batch(rig, [(1, m * block + e) for m, e in SECOND_LENGTHS[:batch_size]], "graph-b", first.num_blocks)
    _replay_and_compare(rig, second, "after block tables and seq_lens changed")
    if rig.runner.support == GraphSupport.ANY and batch_size >= 3:
        rows = [(1, block + 1)] * (batch_size - 2) + [(2, block + 4)]
        mixed = _batch(rig, rows, "graph-c", second.num_blocks)
        _replay_and_compare(rig, mixed, "mixed batch")
