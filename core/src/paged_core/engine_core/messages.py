"""The messages between the front end and the engine core (msgspec structs; the same objects in-process).

The front end sends :class:`CoreRequest` (add), :class:`CoreAbort`, :class:`CoreUtility` and
:class:`CoreShutdown`; the core answers with :class:`CoreOutputs` (per-sequence deltas plus the
step's :class:`SchedulerStats`, and the adds it refused), :class:`CoreUtilityResult`, and once at start-up
:class:`CoreReady` or :class:`CoreFailed`. An add is never answered on its own: the front end streams at once,
and a refusal comes back in the next :class:`CoreOutputs`. Over a socket these are msgpack; between a
front end and a core thread the same objects go through queues. Nothing here holds text: detokenization and
stop strings are the front end's.
"""

from __future__ import annotations

import msgspec

from paged_core.engine_core.beam_params import BeamParams, BeamResult
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams


class CoreRequest(msgspec.Struct, tag="add", frozen=True):
    """A validated request: token ids, bounded params (see :class:`.InputProcessor`)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    priority: int = 0
    arrival_time: float = 0.0
    beam: BeamParams | None = None
    """Beam search instead of sampling (``params`` greedy: see :func:`.check_beam`)."""
    lora: LoRARequest | None = None
    """The LoRA adapter this request runs on (``None``: the base model)."""


class CoreRequests(msgspec.Struct, tag="add_many", frozen=True):
    """Several requests added at once: the core admits them all before its next step (same batches in and out
    of process)."""

    requests: list[CoreRequest]


class CoreAbort(msgspec.Struct, tag="abort", frozen=True):
    """End requests (whole requests by id, or one sequence as ``(request_id, index)``); unknown ids are ignored."""

    request_ids: list[str] = []
    sequences: list[tuple[str, int]] = []
    stopped: bool = False
    """True when the front end matched a stop string (finish status "stopped", not "aborted")."""


class CoreUtility(msgspec.Struct, tag="utility", frozen=True):
    """A call answered with :class:`CoreUtilityResult` of the same ``call_id``: ``reset_prefix_cache``, ``stats``,
    ``load_lora`` and ``remove_lora`` (whose ``args`` are plain msgpack values, see :meth:`.EngineCore.call`)."""

    call_id: int
    method: str
    args: tuple[object, ...] = ()


class CoreShutdown(msgspec.Struct, tag="shutdown", frozen=True):
    """Stop after the current step and exit."""


class SeqDelta(msgspec.Struct, array_like=True):
    """What one step did to one sequence (sample ``index`` of request ``request_id``).

    ``finish_reason`` is ``stop``, ``length`` or ``abort`` once the sequence ended; ``error`` names why the
    core ended it on a failure (sampling its row, or a failed step). ``num_cached_tokens`` is the prompt
    tokens served from the prefix cache, sent with the sequence's first tokens (else -1).
    """

    request_id: str
    index: int
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    num_cached_tokens: int = -1
    error: str | None = None
    beam: BeamResult | None = None
    """A beam-search sequence comes whole, once, with its scores and its group's block figures."""


GRAMMAR_COMPILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GRAMMAR_MASK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
"""Upper bounds (seconds) of the grammar histograms; a ``*_buckets`` list counts one more: past the last bound."""


class GrammarStats(msgspec.Struct, frozen=True, array_like=True):
    """Structured outputs so far (counters): requests, compiles, and the masks of steps with constrained rows."""

    requests: int = 0
    compile_errors: int = 0
    compile_timeouts: int = 0
    compile_buckets: list[int] = []
    """Compiles per :data:`GRAMMAR_COMPILE_BUCKETS` bucket (not cumulative; empty before any)."""
    compile_seconds: float = 0.0
    mask_buckets: list[int] = []
    """Steps with constrained rows per :data:`GRAMMAR_MASK_BUCKETS` bucket of mask time (fill and apply)."""
    mask_seconds: float = 0.0
    mask_rows: int = 0


class SchedulerStats(msgspec.Struct, frozen=True):
    """KV-cache, queue and prefix-cache figures after a step (prefix figures in tokens)."""

    kv_usage: float = 0.0
    num_free_blocks: int = 0
    num_usable_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    steps: int = 0
    graph_mode: str = "eager"
    graph_replays: int = 0
    """Steps run as a compiled or captured graph."""
    graph_piece_replays: int = 0
    """Of ``graph_replays``, steps run as captured or compiled pieces (piecewise)."""
    eager_steps: int = 0
    """Steps run eagerly (every step in eager mode; fallbacks otherwise)."""
    graph_fallbacks: dict[str, int] = {}
    """Eager fallbacks of a graph mode, by reason."""
    spec_verify_rows: int = 0
    """Speculative decoding: rows that verified drafts, so far."""
    spec_draft_tokens: int = 0
    """Draft tokens verified so far."""
    spec_accepted_tokens: int = 0
    """Draft tokens the model kept so far."""
    batch_invariant: bool = False
    """Whether the running configuration is batch-invariant (:mod:`paged_core.loading.batch_invariance`)."""
    grammar: GrammarStats = msgspec.field(default_factory=GrammarStats)
    """Structured outputs' counters and histograms."""


class CoreOutputs(msgspec.Struct, tag="outputs"):
    """One step's deltas (possibly none: an idle core reports stats after an abort) and the stats after it.

    ``failed`` maps request ids the step ended on an error to why (their deltas carry the same ``error``);
    ``step_error`` is set when the step failed as a whole (its requests are in ``failed``). ``refused`` maps
    request ids the core did not admit (read since its last outputs) to why; they produced nothing.
    """

    deltas: list[SeqDelta]
    stats: SchedulerStats
    failed: dict[str, str] = {}
    step_error: str | None = None
    refused: dict[str, str] = {}


class CoreFacts(msgspec.Struct, frozen=True):
    """What the front end needs to know about a running core (sent in the start-up handshake)."""

    model_name: str
    model_source: str
    vocab_size: int
    eos_token_ids: list[int]
    max_model_len: int
    block_size: int
    num_usable_blocks: int
    max_num_seqs: int
    backend: str
    dtype: str
    graph_mode: str
    model_path: str
    batch_invariant: bool = False
    """Whether a request's tokens do not depend on what it is batched with (see
    :mod:`paged_core.loading.batch_invariance`)."""
    batch_variant: list[str] = []
    """Each part that is not batch-invariant, as ``"part: reason"`` (empty when ``batch_invariant``)."""
    kv_cache_dtype: str = ""
    """The KV cache's dtype as ``--kv-cache-dtype`` names it (``bfloat16``, ``int8``, ``fp8_e4m3``...), resolved."""


class CoreReady(msgspec.Struct, tag="ready", frozen=True):
    """Start-up succeeded."""

    facts: CoreFacts
    stats: SchedulerStats


class CoreFailed(msgspec.Struct, tag="failed", frozen=True):
    """Start-up failed; ``message`` is what the user should read."""

    message: str
    error_type: str


class CoreUtilityResult(msgspec.Struct, tag="utility_result", frozen=True):
    """The answer to :class:`CoreUtility` ``call_id``: a msgspec-encodable value, or ``error``."""

    call_id: int
    result: object = None
    error: str | None = None


ToCore = CoreRequest | CoreRequests | CoreAbort | CoreUtility | CoreShutdown
FromCore = CoreOutputs | CoreUtilityResult | CoreReady | CoreFailed
