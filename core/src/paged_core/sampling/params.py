"""Per-request sampling parameters, validated when built (vLLM/OpenAI field names)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from paged_core.errors import RequestRejectedError

# Below this temperature sampling is treated as greedy: dividing logits by a
# near-zero temperature only overflows, and the distribution is a one-hot anyway.
GREEDY_EPSILON = 1e-5
MAX_LOGPROBS = 20


def _reject(name: str, value: object, accepted: str) -> RequestRejectedError:
    return RequestRejectedError(f"SamplingParams.{name} must be {accepted}; got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not _is_int(value) or cast(int, value) < low or (high is not None and cast(int, value) > high):
        accepted = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise _reject(name, value, accepted)


def _check_real(name: str, value: object, ok: bool, accepted: str) -> None:
    if not _is_real(value) or not ok:
        raise _reject(name, value, accepted)


def _normalise_stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items: Sequence[object] = (value,) if isinstance(value, str) else cast(Sequence[object], value)
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise _reject("stop", value, "None, a non-empty str or a list of non-empty strs")
    return tuple(cast(Sequence[str], items))


def _normalise_token_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in value):
        raise _reject("stop_token_ids", value, "None or a list of non-negative ints")
    return tuple(cast(Sequence[int], value))


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the tokens of one request.

    ``temperature`` 0 means greedy. ``top_k`` 0 or -1 turns top-k off.
    ``stop`` is normalised to a tuple of non-empty strings and
    ``stop_token_ids`` to a tuple of ints (read ``stop_strings`` for a typed
    view). ``logprobs`` asks for the sampled token's log-probability plus the
    ``logprobs`` most likely tokens of the model's raw distribution (0 means
    only the sampled token's). Every invalid field raises
    :class:`~paged_core.errors.RequestRejectedError` naming it. Use
    :func:`dataclasses.replace` to derive a modified copy.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        t = self.temperature
        _check_real("temperature", t, _is_real(t) and t >= 0, "a finite number >= 0 (0 = greedy)")
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 0):
            raise _reject("top_k", self.top_k, "an int >= 1, or 0 / -1 to disable top-k")
        p = self.top_p
        _check_real("top_p", p, _is_real(p) and 0 < p <= 1, "a number in (0, 1]")
        mp = self.min_p
        _check_real("min_p", mp, _is_real(mp) and 0 <= mp <= 1, "a number in [0, 1]")
        rp = self.repetition_penalty
        _check_real("repetition_penalty", rp, _is_real(rp) and rp > 0, "a finite number > 0 (1 = off)")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            _check_real(name, v, _is_real(v) and -2 <= v <= 2, "a number in [-2, 2]")
        if self.seed is not None and not _is_int(self.seed):
            raise _reject("seed", self.seed, "None or an int")
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise _reject("min_tokens", self.min_tokens, f"<= max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise _reject(name, getattr(self, name), "a bool")
        # Frozen dataclass: normalised values are written through object.__setattr__.
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_token_ids(self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        """True when the token is the argmax (temperature 0, or too small to matter)."""
        return self.temperature < GREEDY_EPSILON

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as the tuple it was normalised to."""
        return cast(tuple[str, ...], self.stop)

    @property
    def has_penalties(self) -> bool:
        """True when any repetition, frequency or presence penalty changes the logits."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
