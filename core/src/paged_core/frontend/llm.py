"""The offline API: ``LLM().generate(prompts)`` and ``LLM().chat(messages)``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from paged_core.engine_config import EngineConfig
from paged_core.engine_core.beam_params import BeamParams
from paged_core.errors import PagedError, RequestRejectedError
from paged_core.frontend.beam_outputs import BeamSearchOutput
from paged_core.frontend.input_processor import PROMPT_KINDS, InputError, prompt_type_problem
from paged_core.frontend.llm_engine import LLMEngine
from paged_core.frontend.outputs import RequestMetrics, RequestOutput
from paged_core.lora.request import LoRARequest
from paged_core.sampling.params import SamplingParams

log = logging.getLogger("paged.llm")

Prompt = str | Seq[int]
Message = Mapping[str, Any]


class LLM:
    """A model served from a paged KV cache, for offline batches.

    ``LLM()`` loads the embedded default (SmolLM2-135M-Instruct) on the
    best available backend; keyword arguments are :class:`EngineConfig`
    fields (``backend``, ``dtype``, ``kv_cache_memory``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``...).
    ``multiprocess=True`` runs the engine core in a child process (as ``paged serve`` does);
    outputs are the same token for token. Call :meth:`close` (or use ``with``) to stop it.
    """

    def __init__(self, model: str | None = None, *, multiprocess: bool = False, **kwargs: Any) -> None:
        self.engine = LLMEngine(EngineConfig.of(model=model, **kwargs), multiprocess=multiprocess)

    def close(self) -> None:
        """Stop the engine core (a child process exits); idempotent."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reconfigured(self, **changes: Any) -> LLM:
        """A new LLM sharing this one's weights, tokenizer and backend, with a fresh KV cache and scheduler.

        ``changes`` are :class:`EngineConfig` fields that do not change what is
        loaded (KV budget, block size, scheduler limits, prefix caching).
        """
        fixed = {"model", "backend", "dtype", "device", "trust_remote_code"} & changes.keys()
        if fixed:
            raise ValueError(f"reconfigured() cannot change {sorted(fixed)}: build a new LLM for that")
        config = self.engine.config.replace(**changes)
        clone = LLM.__new__(LLM)
        clone.engine = LLMEngine(config, self.engine.loaded)
        return clone

    @property
    def tokenizer(self) -> Any | None:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt (text, or a list of token ids); outputs come back in prompt order.

        ``lora_request`` runs every prompt on one LoRA adapter, or each on its own (a list; ``None`` entries
        run the base model); the engine needs ``enable_lora=True``.

        Token ids may be Python or numpy ints (a list, a tuple or a 1-D numpy array); a prompt of any
        other type (bytes, a dict, nested lists, bools, floats...) is refused naming its index and type.
        A prompt the engine refuses gets an output with ``error`` set while the
        others run; if every prompt is refused, the first error is raised.
        """
        batch = _as_batch(prompts)
        params = _per_prompt(sampling_params, len(batch))
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras: list[LoRARequest | None] = [lora_request] * len(batch)
        else:
            loras = list(lora_request)
            if len(loras) != len(batch):
                raise InputError(f"lora_request has {len(loras)} entries for {len(batch)} prompts", "lora_request")
        return self._run(batch, params, use_tqdm, cache_salt, loras=loras)

    def beam_search(
        self,
        prompts: Prompt | Seq[Prompt],
        beam_width: int,
        max_tokens: int = 16,
        length_penalty: float = 1.0,
        *,
        early_stopping: bool | str = False,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Seq[int] | None = None,
        skip_special_tokens: bool = True,
        use_tqdm: bool = True,
        cache_salt: str | None = None,
    ) -> list[BeamSearchOutput]:
        """Beam search over every prompt: its ``beam_width`` best sequences, best first, in prompt order.

        The same search as transformers' ``generate(num_beams=beam_width, do_sample=False,
        num_return_sequences=beam_width, length_penalty=..., early_stopping=...)``: finished beams are
        ranked by ``sum_logprobs / len**length_penalty``. Beams share their KV blocks copy-on-write (see
        ``metrics.peak_blocks``). ``stop_token_ids`` end a beam as the model's EOS does. A refused
        prompt gets an output with ``error`` while the others run; if all are refused, the error is raised.
        """
        beam = BeamParams(beam_width, length_penalty, early_stopping)
        ok = isinstance(beam_width, int) and not isinstance(beam_width, bool) and beam_width >= 1
        # n is checked against beam_width by the engine, which names beam_width if that is what is wrong.
        params = SamplingParams(
            n=beam_width if ok else 1,
            temperature=0.0,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=stop_token_ids,
            skip_special_tokens=skip_special_tokens,
        )
        batch = _as_batch(prompts)
        outs = self._run(batch, [params] * len(batch), use_tqdm, cache_salt, beam)
        return [BeamSearchOutput.of(out) for out in outs]

    def chat(
        self,
        messages: Seq[Message] | Seq[Seq[Message]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of ``{"role", "content"}``) or a list of them via the chat template.

        A conversation the template cannot render (not a list of such dicts, or refused by the template) gets
        an output with ``error`` naming its index while the others run, as :meth:`generate` does for prompts.
        """
        conversations = _as_conversations(messages)
        prompts: list[Prompt] = []
        refused: dict[int, PagedError] = {}
        for i, conversation in enumerate(conversations):
            try:
                if not isinstance(conversation, (list, tuple)):
                    kind = type(conversation).__name__
                    raise InputError(f"must be a list of {{'role', 'content'}} dicts; got {kind}", "messages")
                prompts.append(self.apply_chat_template(conversation, add_generation_prompt, chat_template_kwargs))
            except InputError as exc:
                refused[i] = InputError(f"conversation {i}: {exc}", exc.param or "messages")
                prompts.append([])  # never sent: its place in the outputs
        params = _per_prompt(sampling_params, len(prompts))
        return self._run(prompts, params, use_tqdm, None, refused=refused)

    def apply_chat_template(
        self,
        conversation: Seq[Message],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a conversation rendered through the model's chat template."""
        return self.engine.input.render_chat(conversation, add_generation_prompt, chat_template_kwargs)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Run one request and yield its output after every step that changed it (for streaming UIs)."""
        rid = self.engine.add_request(prompt, sampling_params)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort_request([rid])

    def _run(
        self,
        prompts: list[Prompt],
        params: list[SamplingParams],
        use_tqdm: bool,
        cache_salt: str | None,
        beam: BeamParams | None = None,
        refused: Mapping[int, PagedError] | None = None,
        loras: Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Outputs of ``prompts`` in order; ``refused`` holds prompts already refused, by index (never sent)."""
        engine = self.engine
        # Refusals by index, each with the text its output carries (naming the prompt's index).
        refusals: dict[int, tuple[PagedError, str]] = {i: (exc, str(exc)) for i, exc in (refused or {}).items()}
        for i, prompt in enumerate(prompts):
            problem = None if i in refusals else prompt_type_problem(prompt)
            if problem is not None:
                wrong_type = InputError(f"prompt {i} must be {PROMPT_KINDS}; {problem}", "prompt")
                refusals[i] = (wrong_type, str(wrong_type))
        sendable = [i for i in range(len(prompts)) if i not in refusals]
        # Added at once, so the core admits them all before its first step, in process or out.
        added: list[str | PagedError] = []
        if sendable:
            added = engine.add_requests(
                [prompts[i] for i in sendable],
                [params[i] for i in sendable],
                cache_salt=cache_salt,
                beam=beam,
                lora_requests=[loras[i] for i in sendable] if loras is not None else None,
            )
        request_ids: dict[int, str] = {}
        for i, rid_or_error in zip(sendable, added, strict=True):
            if isinstance(rid_or_error, str):
                request_ids[i] = rid_or_error
            else:
                refusals[i] = (rid_or_error, f"prompt {i}: {rid_or_error}")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        for i, prompt in enumerate(prompts):
            if i in request_ids:
                order.append(request_ids[i])
                continue
            why, text = refusals[i]
            rid = f"refused-{i}"
            order.append(rid)
            results[rid] = RequestOutput(
                rid, prompt if isinstance(prompt, str) else None, [], [], True, RequestMetrics(0.0), error=text
            )
            log.warning("prompt %d refused: %s", i, why)
        if refusals and len(refusals) == len(prompts):
            raise refusals[min(refusals)][0]
        pending = {rid for rid in order if rid not in results}
        with tqdm(total=len(pending), desc="generating", unit="req", disable=not use_tqdm) as bar:
            try:
                while pending:
                    for out in engine.step():
                        if out.finished and out.request_id in pending:
                            results[out.request_id] = out
                            pending.discard(out.request_id)
                            bar.update(1)
            except BaseException:
                engine.abort_request(list(pending))
                raise
        return [results[rid] for rid in order]


# What can stand for one whole prompt (or conversation); a list of anything else is one prompt of token ids.
_ONE_PROMPT = (str, bytes, bytearray, memoryview, Mapping)
_PROMPT_LIKE = (*_ONE_PROMPT, list, tuple, np.ndarray)


def _as_batch(prompts: object) -> list[Any]:
    """The prompts as a list: one prompt (text, token ids, or something refused later) or several.

    A list none of whose items could be a prompt itself is one prompt of token ids, so that ``[1, 2, True]``
    is refused as such (naming the bool), not as three prompts; bytes are one prompt, never token ids.
    """
    if isinstance(prompts, _ONE_PROMPT) or (isinstance(prompts, np.ndarray) and prompts.ndim == 1):
        return [prompts]
    if not isinstance(prompts, Iterable):
        return [prompts]  # e.g. generate(5): one prompt, refused naming its type
    items = list(prompts)
    if not items:
        raise RequestRejectedError("prompts is empty: pass a string, a list of strings, or lists of token ids")
    if not any(isinstance(t, _PROMPT_LIKE) for t in items):
        return [items]  # a single prompt given as token ids
    return items


def _as_conversations(messages: object) -> list[Any]:
    """One conversation (a list of message dicts) or several, as a list of conversations."""
    if isinstance(messages, _ONE_PROMPT) or not isinstance(messages, Iterable):
        return [messages]  # one conversation of the wrong type, refused naming it
    items = list(messages)
    if not items:
        raise RequestRejectedError("messages is empty: pass a conversation (a list of message dicts) or a list of them")
    if isinstance(items[0], Mapping):
        return [items]
    return items


def _per_prompt(params: SamplingParams | Seq[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    items = list(params)
    if len(items) != n:
        raise RequestRejectedError(f"got {len(items)} sampling_params for {n} prompts; pass one, or one per prompt")
    return items
