"""What one scheduling step hands to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_core.lora.request import LoRARequest


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (or must re-create after preemption or fork).

    ``token_ids`` are all known tokens; ``num_computed_tokens`` of them are
    already in the KV cache (prefix hits, or a fork's shared blocks).
    ``block_ids[g]`` is the block table of KV-cache group ``g`` (one group unless the model mixes
    attention kinds); entries behind a sliding window may be 0 (the null block).
    """

    req_id: str
    token_ids: list[int]
    block_ids: list[list[int]]
    num_computed_tokens: int
    lora: LoRARequest | None = None
    """The request's adapter (the runner loads it if it has not yet)."""


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already knows, as parallel lists (cheap at thousands of rows).

    ``new_block_ids[i]`` are only the blocks gained this step, one list per
    KV-cache group appended to that group's table (``[]`` when no group gained
    any); ``num_computed_tokens[i]`` is the count before this step;
    ``new_token_ids[i]`` are the tokens appended to the request since the runner
    last heard of it (the tokens sampled in earlier steps), so the runner needs
    nothing but scheduler outputs to know every row's inputs.
    """

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[list[int]]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan.

    Before running attention the runner must perform ``block_copies``
    (source, destination) and apply ``replaced_block_ids`` ((group, table
    index, new block id) per request): both come from copy-on-write of shared
    blocks. A sliding group's blocks that left the window are not announced:
    the runner's table keeps their old ids, which the window never reads.
    Requests in ``preempted_req_ids`` and ``finished_req_ids`` must be dropped
    by the runner; preempted ones return later as new requests. Plans reach the
    runner in the order they were made.
    """

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    block_copies: list[tuple[int, int]]
    replaced_block_ids: dict[str, list[tuple[int, int, int]]]
    finished_req_ids: set[str]
    preempted_req_ids: list[str]
    placeholder_req_ids: list[str] = field(default_factory=list)
    """Asynchronous scheduling: rows whose last input token is the one the previous step, still running when
    this plan was made, samples for them. It is missing from their ``token_ids``/``new_token_ids``: the core
    appends it there before the runner sees this plan."""

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class RequestUpdate:
    """What a step did to one request: tokens appended, the finish status if it ended, and its prefix-cache hit.

    ``num_cached_tokens`` is the request's prefix-cache hit at its first admission (reported with its first token).
    """

    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
