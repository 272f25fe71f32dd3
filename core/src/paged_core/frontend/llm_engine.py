"""LLMEngine: the synchronous front end (input processor, a core client, output processor)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

import msgspec

from paged_core.clients.factory import make_client
from paged_core.clients.in_process import InProcClient
from paged_core.data_parallel import require_one_engine_core
from paged_core.engine_config import EngineConfig
from paged_core.engine_core.beam_params import BeamParams
from paged_core.engine_core.core import EngineCore
from paged_core.engine_core.messages import CoreAbort, CoreRequest, SchedulerStats, SeqDelta
from paged_core.errors import PagedError, RequestRejectedError
from paged_core.frontend.input_processor import InputProcessor
from paged_core.frontend.output_processor import OutputProcessor
from paged_core.frontend.outputs import RequestOutput
from paged_core.loading.build import LoadedModel
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams


class StepFailedError(PagedError, RuntimeError):
    """An engine step failed as a whole; the requests it ran are ended (see :attr:`LLMEngine.failed`)."""


class LLMEngine:
    """Continuous batching over a paged KV cache, driven step by step.

    Call :meth:`add_request` any time and :meth:`step` in a loop; each step's outputs are the
    cumulative :class:`RequestOutput` of every request that progressed. The engine core runs in
    this process (the default) or, with ``multiprocess=True``, in a child process behind a socket
    (:mod:`paged_core.clients.factory` picks the client); outputs are the same token for token.

    No request can fail another: request data is bounded at admission, a row the sampler cannot
    serve ends alone, and a step that fails as a whole ends only the requests it was running (it
    raises :class:`StepFailedError` after reporting them). :attr:`failed` names the requests the
    last step ended on an error.
    """

    def __init__(
        self, config: EngineConfig | None = None, loaded: LoadedModel | None = None, *, multiprocess: bool = False
    ) -> None:
        self.config = config or EngineConfig()
        require_one_engine_core(self.config, "an LLMEngine (and LLM)")
        client, tokenizer = make_client(self.config, event_loop=False, in_process=not multiprocess, loaded=loaded)
        self.client = client
        self.facts = client.facts
        self.tokenizer = tokenizer
        self.input = InputProcessor(tokenizer, self.facts)
        self.output = OutputProcessor(tokenizer)
        self.stats = SchedulerStats()
        self.failed: dict[str, str] = {}
        """Request id -> why, for the requests the last :meth:`step` ended on an error (reset by each step)."""
        self._ids = itertools.count()

    # ---- in-process internals (tests, benchmarks) -------------------------
    @property
    def core(self) -> EngineCore:
        """The engine core, when it runs in this process."""
        if not isinstance(self.client, InProcClient):
            raise AttributeError("the engine core runs in another process")
        return self.client.core

    @property
    def loaded(self) -> LoadedModel:
        """Weights, tokenizer and backend of an in-process core (shareable with another engine)."""
        return self.core.loaded

    # ---- requests -----------------------------------------------------
    def tokenize(self, prompt: str | Seq[int], field: str = "prompt") -> list[int]:
        """Token ids of a prompt given as text or as ids; refuses empty and malformed prompts."""
        return self.input.tokenize(prompt, field)

    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        beam: BeamParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """Queue a request (a beam search with ``beam``; on a LoRA adapter with ``lora_request``); returns its
        id. Raises :class:`RequestRejectedError` naming what is wrong."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.output:
            raise RequestRejectedError(f"request id {rid!r} is already in use")
        request = self.input.process(
            rid, prompt, params, cache_salt=cache_salt, priority=priority, beam=beam, lora=lora_request
        )
        refused = self.client.add([request])
        if refused:
            raise RequestRejectedError(refused[rid])
        self.output.add(request, prompt if isinstance(prompt, str) else None)
        return rid

    def add_requests(
        self,
        prompts: Seq[str | Seq[int]],
        params: Seq[SamplingParams | None],
        *,
        cache_salt: str | None = None,
        beam: BeamParams | None = None,
        lora_requests: Seq[LoRARequest | None] | None = None,
    ) -> list[str | PagedError]:
        """Queue several requests at once (admitted together before the next step, in or out of process).

        ``lora_requests`` gives each prompt its adapter (``None``: the base model). Returns, per prompt, its
        request id or the error that refused it; the others are queued regardless.
        """
        results: list[str | PagedError] = []
        queued: list[tuple[int, CoreRequest, str | None]] = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            rid = f"req-{next(self._ids)}"
            try:
                lora = lora_requests[i] if lora_requests is not None else None
                request = self.input.process(rid, prompt, p, cache_salt=cache_salt, beam=beam, lora=lora)
            except PagedError as exc:
                results.append(exc)
                continue
            results.append(rid)
            queued.append((i, request, prompt if isinstance(prompt, str) else None))
        refused = self.client.add([r for _, r, _ in queued]) if queued else {}
        for i, request, text in queued:
            why = refused.get(request.request_id)
            if why is not None:
                results[i] = RequestRejectedError(why)
            else:
                self.output.add(request, text)
        return results

    def abort_request(self, request_ids: Seq[str]) -> None:
        """Abort requests (unknown ids are ignored); their blocks are freed at once."""
        ids = [rid for rid in request_ids if rid in self.output]
        if ids:
            self.output.remove(ids)
            self.client.abort(CoreAbort(request_ids=ids))

    def has_unfinished_requests(self) -> bool:
        return len(self.output) > 0

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.output)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block (False if some are in use)."""
        return bool(self.client.call("reset_prefix_cache"))

    # ---- one step -----------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run (or, multi-process, receive) one step; returns the outputs of requests that changed.

        A request whose row the sampler cannot serve ends alone: it comes back finished with
        ``error`` set, and is named in :attr:`failed`. If the step failed as a whole, its requests
        are ended the same way and :class:`StepFailedError` is raised (their outputs are lost with
        the step); the waiting requests and the engine are untouched, so the caller may step on.
        """
        if not self.output and not isinstance(self.client, InProcClient):
            return []  # a core process with nothing to do sends nothing: do not wait for it
        outputs = self.client.step()
        if outputs.refused:  # a core across a transport answers adds here: each refused request ends with its reason
            refusals = [SeqDelta(rid, 0, [], finish_reason="abort", error=why) for rid, why in outputs.refused.items()]
            outputs = msgspec.structs.replace(outputs, deltas=refusals + outputs.deltas)
        self.stats = outputs.stats
        self.failed = dict(outputs.failed)
        results, stopped = self.output.process(outputs)
        if stopped:
            self.client.abort(CoreAbort(sequences=stopped, stopped=True))
        if outputs.step_error is not None:
            raise StepFailedError(f"engine step failed: {outputs.step_error}")
        return results

    def shutdown(self) -> None:
        """Stop the core (a child process exits); idempotent."""
        self.client.shutdown()
