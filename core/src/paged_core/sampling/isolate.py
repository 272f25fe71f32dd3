"""Sampling that loses only the rows that fail: the batched call first, then row by row if it raises.

The admission checks keep request data from breaking a step, but a step
must not end every tenant's request if one row still trips the sampler: the
rows are then retried one at a time, and only those that fail again are
reported, each with its error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.sampler import Sampler, SamplerOutput
from paged_core.sampling.state import SamplingState


def sample_isolated(
    sampler: Sampler, logits: torch.Tensor, states: Sequence[SamplingState], num_samples: Sequence[int]
) -> tuple[SamplerOutput, dict[int, Exception]]:
    """:meth:`Sampler.sample` for every row that can be sampled, and the error of each row that cannot.

    Returns the output (a failed row has no token ids and no logprobs) and
    ``{row: exception}`` for the failed rows (empty when the batched call
    succeeds, which is the only cost on the common path). A retried row draws
    again from its random stream, so a seeded row retried after a failure may
    differ from what it would have drawn in a clean batch.
    """
    try:
        return sampler.sample(logits, states, num_samples), {}
    except Exception:
        pass  # whatever failed, the rows retried one by one below show which are responsible
    token_ids: list[list[int]] = []
    logprobs: list[list[TokenLogprobs] | None] = []
    failures: dict[int, Exception] = {}
    for i, state in enumerate(states):
        try:
            one = sampler.sample(logits[i : i + 1], [state], [num_samples[i]])
        except Exception as exc:
            failures[i] = exc
            token_ids.append([])
            logprobs.append(None)
        else:
            token_ids.append(one.token_ids[0])
            logprobs.append(one.logprobs[0])
    return SamplerOutput(token_ids, logprobs), failures
