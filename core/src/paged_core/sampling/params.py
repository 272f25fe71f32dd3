"""Per-request sampling parameters, validated when built (vLLM/OpenAI field names)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from paged_core.errors import RequestRejectedError
from paged_core.structured.spec import StructuredOutputs

# Below this temperature sampling is treated as greedy: dividing logits by a
# near-zero temperature only overflows, and the distribution is a one-hot anyway.
GREEDY_EPSILON = 1e-5
MAX_LOGPROBS = 20
# Integer fields end up in int64 tensors or C++ code; anything outside int64 is refused at construction.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Stop strings are matched on every token of every sequence: their count and size are capped.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096
"""Total characters over all of a request's stop strings."""
MAX_STOP_TOKEN_IDS = 4096
# Values echoed in errors are cut to this many characters (a hostile value can be megabytes).
_MAX_ECHO = 120


def _brief(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits() (4300 digits) has no repr
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}... ({len(text)} characters)"


def _reject(name: str, value: object, accepted: str) -> RequestRejectedError:
    return RequestRejectedError(f"SamplingParams.{name} must be {accepted}; got {_brief(value)}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: object) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, or too large: ``float(10**400)`` overflows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _check_int(name: str, value: object, low: int, high: int = INT64_MAX) -> None:
    if not _is_int(value) or not low <= cast(int, value) <= high:
        accepted = f"an int >= {low} and <= 2**63 - 1 (int64)" if high == INT64_MAX else f"an int in [{low}, {high}]"
        raise _reject(name, value, accepted)


def _real(name: str, value: object, ok: Callable[[float], bool], accepted: str) -> float:
    number = _as_float(value)
    if number is None or not ok(number):
        raise _reject(name, value, accepted)
    return number


# The float fields: what each accepts, as a test and as the words of its error.
_REALS: dict[str, tuple[Callable[[float], bool], str]] = {
    "temperature": (lambda v: v >= 0, "a finite number >= 0 (0 = greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (lambda v: v > 0, "a finite number > 0 (1 = off)"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
}


def _normalise_stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items: Sequence[object] = (value,) if isinstance(value, str) else cast(Sequence[object], value)
    if isinstance(items, (list, tuple)) and len(items) > MAX_STOP_STRINGS:
        raise RequestRejectedError(
            f"SamplingParams.stop must be at most {MAX_STOP_STRINGS} strings (MAX_STOP_STRINGS); got {len(items)}"
        )
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise _reject("stop", value, "None, a non-empty str or a list of non-empty strs")
    stops = tuple(cast(Sequence[str], items))
    total = sum(len(s) for s in stops)
    if total > MAX_STOP_CHARS:
        raise RequestRejectedError(
            f"SamplingParams.stop must be at most {MAX_STOP_CHARS} characters in all (MAX_STOP_CHARS); got {total}"
        )
    return stops


def _normalise_token_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)) and len(value) > MAX_STOP_TOKEN_IDS:
        raise RequestRejectedError(
            f"SamplingParams.stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} ids (MAX_STOP_TOKEN_IDS); "
            f"got {len(value)}"
        )
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) and 0 <= t <= INT64_MAX for t in value):
        raise _reject("stop_token_ids", value, "None or a list of ints in [0, 2**63 - 1]")
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
    :class:`~paged_core.errors.RequestRejectedError` naming it and its limit.

    Limits: every int (``n``, ``top_k``, ``seed``, ``max_tokens``,
    ``min_tokens``, each of ``stop_token_ids``) fits int64; at most
    :data:`MAX_STOP_STRINGS` stop strings of :data:`MAX_STOP_CHARS`
    characters in all, and :data:`MAX_STOP_TOKEN_IDS` stop token ids. The
    vocabulary is checked by the engine (:meth:`for_vocabulary`). Use
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
    speculate: bool = True
    """False opts this request out of speculative decoding (where the engine runs it)."""
    structured_outputs: StructuredOutputs | None = None
    """What the output must match (a JSON schema, any JSON object, a regex, a choice or a grammar); None: free text."""

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        if not _is_int(self.top_k) or not -1 <= self.top_k <= INT64_MAX:
            raise _reject("top_k", self.top_k, "an int >= 1 and <= 2**63 - 1 (int64), or 0 / -1 to disable top-k")
        for name, (ok, accepted) in _REALS.items():
            # Stored as floats: an int (even a huge one) never reaches a tensor as an int64.
            object.__setattr__(self, name, _real(name, getattr(self, name), ok, accepted))
        if self.seed is not None and (not _is_int(self.seed) or not INT64_MIN <= self.seed <= INT64_MAX):
            raise _reject("seed", self.seed, "None or an int in [-2**63, 2**63 - 1]")
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise _reject("min_tokens", self.min_tokens, f"<= max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "speculate"):
            if not isinstance(getattr(self, name), bool):
                raise _reject(name, getattr(self, name), "a bool")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputs):
            raise _reject("structured_outputs", self.structured_outputs, "None or a StructuredOutputs")
        # Frozen dataclass: normalised values are written through object.__setattr__.
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_token_ids(self.stop_token_ids))

    def for_vocabulary(self, vocab_size: int) -> SamplingParams:
        """These params checked against a model's vocabulary: stop token ids inside it, ``top_k`` clamped to it.

        A ``top_k`` above the vocabulary keeps every token, exactly as ``top_k =
        vocab_size`` does, so it is clamped rather than refused (the sampler then
        never sees a number wider than the logits). Returns ``self`` when nothing
        changes; a stop token id outside ``[0, vocab_size)`` raises
        :class:`~paged_core.errors.RequestRejectedError` naming the field and the size.
        """
        outside = [t for t in cast(tuple[int, ...], self.stop_token_ids) if t >= vocab_size]
        if outside:
            raise RequestRejectedError(
                f"SamplingParams.stop_token_ids must be token ids in [0, {vocab_size}) (the vocabulary size); "
                f"got {_brief(outside[:5])}"
            )
        if self.top_k > vocab_size:
            return dataclasses.replace(self, top_k=vocab_size)
        return self

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
