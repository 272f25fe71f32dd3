"""Warm-up batches for the compiled step that look, to dynamo's guards, like the runner's real steps.

A compiled graph is reused only when every guard dynamo installed while
tracing holds, and dynamo guards more than shapes: a tensor's dispatch keys
(an inference tensor is not a normal one) and the size of a view's base. The
runner's step tensors are views of buffers allocated once, outside inference
mode, by a :class:`~paged_core.runner.batch.BatchBuilder`; so a warm-up batch
is built by one too, with the runner's row budget and block-table width. A
warm-up built differently (fresh inference tensors, a one-block table, bases
the size of the batch) compiled graphs that no real step could use, so each
first real step of a kind recompiled. (Equal sizes that are a coincidence are
the executor's business: it traces without duck sizing.)
"""

from __future__ import annotations

import torch

from paged_core.runner.batch import BatchBuilder, RowState, StepBatch

WARM_UP_SHAPES = ((1,), (3,), (1, 3))
"""Query lengths per row: one decode; one prefill row; several rows (a decode and a prefill).

Dynamo specialises a dimension of size 1, so one-row steps (a single request
decoding, or prefilling alone) and one-token steps need graphs of their own;
the several-row batch, whose dimensions are all distinct and above 1, serves
every other step.
"""


def warm_up_batch(
    query_lens: tuple[int, ...], block_size: int, device: torch.device, max_num_reqs: int, max_blocks_per_seq: int
) -> StepBatch:
    """A batch of rows with ``query_lens`` new tokens over the null block, every slot -1 (writes nothing)."""
    rows = max(max_num_reqs, len(query_lens))
    with torch.inference_mode(False):  # the runner allocates its buffers at start, outside inference mode
        builder = BatchBuilder(sum(query_lens) + 8, rows, max_blocks_per_seq, block_size, device)
    scheduled = [
        (f"warm-up-{i}", RowState([0] * q, [[0] * -(-q // block_size)], 0), q) for i, q in enumerate(query_lens)
    ]
    batch = builder.build(scheduled)
    batch.metadata.slot_mapping.fill_(-1)
    return batch
