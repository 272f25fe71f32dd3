"""A request as the scheduler sees it: token ids, progress counters and stop rules."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Iterable, Sequence
from typing import Any

from paged_core.errors import RequestRejectedError
from paged_core.lora.request import LoRARequest


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
_arrivals = itertools.count()


class Request:
    """One sequence being generated.

    ``num_computed_tokens`` counts tokens whose KV is (or, once the scheduled
    step runs, will be) in the cache; ``num_tokens`` counts known token ids
    (prompt + output). Speculative draft tokens in ``spec_token_ids`` are
    scheduled like any others but only become output once accepted.
    """

    __slots__ = (
        "_arrival_seq",
        "all_token_ids",
        "arrival_time",
        "block_hashes",
        "cache_salt",
        "eos_token_id",
        "extra_keys",
        "ignore_eos",
        "lora",
        "lora_id",
        "max_tokens",
        "min_tokens",
        "num_announced_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_output_placeholders",
        "num_preemptions",
        "num_prompt_tokens",
        "priority",
        "request_id",
        "spec_token_ids",
        "status",
        "stop_reason",
        "stop_token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int = 16,
        min_tokens: int = 0,
        stop_token_ids: Iterable[int] = (),
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        lora_id: int | str | None = None,
        extra_keys: tuple[Any, ...] = (),
        lora: LoRARequest | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise RequestRejectedError(f"request {request_id!r}: the prompt is empty")
        if max_tokens < 1:
            raise RequestRejectedError(f"request {request_id!r}: max_tokens must be >= 1, got {max_tokens}")
        if min_tokens < 0 or min_tokens > max_tokens:
            raise RequestRejectedError(
                f"request {request_id!r}: need 0 <= min_tokens <= max_tokens, got {min_tokens} and {max_tokens}"
            )
        self.request_id = request_id
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.stop_token_ids = frozenset(stop_token_ids)
        self.eos_token_id = eos_token_id
        self.ignore_eos = ignore_eos
        self.priority = priority
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        # Tie-breaker so equal arrival times still order by submission.
        self._arrival_seq = next(_arrivals)
        self.cache_salt = cache_salt
        self.lora = lora
        """The adapter this request runs on (its id keys the prefix cache)."""
        self.lora_id = lora.id if lora is not None else lora_id
        self.extra_keys = extra_keys
        self.num_computed_tokens = 0
        self.num_announced_tokens = 0  # tokens the model runner has been told of (through scheduler outputs)
        self.spec_token_ids: list[int] = []
        # Asynchronous scheduling: tokens a step still running will sample for this request, scheduled before known.
        self.num_output_placeholders = 0
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = -1  # prefix-cache hit at first admission; -1 until admitted
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status in _FINISHED

    def order_key(self) -> tuple[float, int]:
        """Arrival order (earlier first)."""
        return (self.arrival_time, self._arrival_seq)

    def priority_key(self) -> tuple[int, float, int]:
        """Scheduling order under the priority policy: lower value first, then earlier arrival."""
        return (self.priority, self.arrival_time, self._arrival_seq)

    def clone(self, request_id: str) -> Request:
        """A new request with this one's prompt, stop rules, priority, arrival and cache keys (no progress)."""
        return Request(
            request_id,
            self.prompt_token_ids,
            max_tokens=self.max_tokens,
            min_tokens=self.min_tokens,
            stop_token_ids=self.stop_token_ids,
            eos_token_id=self.eos_token_id,
            ignore_eos=self.ignore_eos,
            priority=self.priority,
            arrival_time=self.arrival_time,
            cache_salt=self.cache_salt,
            lora_id=self.lora_id,
            extra_keys=self.extra_keys,
            lora=self.lora,
        )

    def check_stop(self, token_id: int, max_len: int) -> RequestStatus | None:
        """Stop rule for a just-appended ``token_id``: returns the finish status, or None to go on."""
        n_out = len(self.all_token_ids) - self.num_prompt_tokens
        if n_out >= self.min_tokens:
            if token_id == self.eos_token_id and not self.ignore_eos:
                self.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
            if token_id in self.stop_token_ids:
                self.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if n_out >= self.max_tokens or len(self.all_token_ids) >= max_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, computed={self.num_computed_tokens}/"
            f"{self.num_tokens}, prompt={self.num_prompt_tokens})"
        )
