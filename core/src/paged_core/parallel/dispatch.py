"""Token dispatch over the expert-parallel ranks: each rank's share of a step's tokens, and the collectives.

The expert-parallel group is the tensor-parallel group, which is ``torch.distributed``'s default group
(:class:`~paged_core.parallel.group.TPGroup`): gloo on CPU hosts, NCCL on CUDA devices. Both run
:func:`all_to_all` as ``all_to_all_single`` with uneven splits (gloo's alltoallv: checked on torch 2.13,
including zero-row splits). The splits are Python ints, read on the host by the caller: the exchange
runs eagerly, outside any traced graph.
"""

from __future__ import annotations

import torch


def token_slice(tokens: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s contiguous share of ``tokens`` rows: the first ``tokens % world`` ranks get one more.

    The shares are in rank order, so concatenating what the ranks send by source rank keeps the step's token
    order (empty shares when ``tokens < world``).
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world}")
    base, extra = divmod(tokens, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def all_to_all(send: torch.Tensor, send_splits: list[int] | None, recv_splits: list[int] | None) -> torch.Tensor:
    """Rows ``send`` split by ``send_splits`` (rows for each rank, in rank order) to their ranks; returns the rows
    received, ``recv_splits`` from each rank in rank order (``None``: equal splits of ``send``'s rows)."""
    import torch.distributed as dist

    rows = sum(recv_splits) if recv_splits is not None else send.shape[0]
    out = send.new_empty((rows, *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits)
    return out


def all_gather_rows(local: torch.Tensor, tokens: int, rank: int, world: int) -> torch.Tensor:
    """Every rank's share (:func:`token_slice` of ``tokens``) concatenated in rank order: ``[tokens, ...]``, the same
    on every rank. The shares travel padded to the largest (a collective of equal sizes)."""
    import torch.distributed as dist

    size = token_slice(tokens, 0, world).stop  # rank 0's share is the largest
    mine = token_slice(tokens, rank, world)
    if local.shape[0] != mine.stop - mine.start:
        raise ValueError(f"rank {rank} holds {local.shape[0]} of {tokens} rows over {world} ranks")
    padded = local.new_zeros((size, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    shares = [token_slice(tokens, r, world) for r in range(world)]
    return torch.cat([part[: s.stop - s.start] for part, s in zip(parts, shares, strict=True)])
