"""Assembling an engine's parts: backend choice, model, KV cache and scheduler, with the reasons logged."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from paged_core._version import __version__
from paged_core.config import blocks_for_memory
from paged_core.contract.backend import AttentionBackend
from paged_core.contract.capabilities import AttentionSpec
from paged_core.engine_config import EngineConfig
from paged_core.errors import BackendUnavailableError, ConfigError, UnsupportedConfigError
from paged_core.loading.batch_invariance import (
    BatchInvariance,
    VariantPart,
    batch_invariance,
    model_expert_kinds,
    model_linear_kinds,
)
from paged_core.loading.dtype import resolve_dtype
from paged_core.loading.kv_budget import default_budget
from paged_core.loading.kv_dtype import describe_kv_dtype, kv_dtype_name, resolve_kv_dtype
from paged_core.loading.loader import (
    ModelSource,
    check_gguf,
    load_model,
    load_tokenizer,
    resolve_source,
    serves_packed,
)
from paged_core.lora import LoRAAdapter, LoRARequest, LoRASlots, load_adapter
from paged_core.lora.adapter import model_shapes
from paged_core.memory.kv_groups import KVCacheGroups
from paged_core.parallel.experts import check_ep, shard_experts
from paged_core.parallel.group import STARTUP_TIMEOUT, TPGroup
from paged_core.parallel.leader import Leader, start_leader
from paged_core.parallel.placement import place
from paged_core.parallel.shard import shard_model
from paged_core.parallel.tp_sizes import check_tp_size, local_specs
from paged_core.registry import BackendRegistry, BackendStatus, load_registry
from paged_core.runner.attention import layer_specs, register_paged_attention
from paged_core.runner.compile_cache import CompileCache
from paged_core.runner.executors import resolve_graph_mode
from paged_core.runner.forward import ModelForward, make_forward, model_path
from paged_core.runner.fused.families import fused_refusal
from paged_core.runner.model_runner import ModelRunner
from paged_core.runner.packed_linear import attach_ops, packed_modules
from paged_core.runner.profile import profile_peak_bytes
from paged_core.sched.scheduler import Scheduler
from paged_core.speculative import Proposer, make_proposer
from paged_core.speculative.draft import DraftModelProposer, check_same_vocabulary

log = logging.getLogger("paged.engine")


@dataclass
class EngineParts:
    """Everything :class:`~paged_core.frontend.llm_engine.LLMEngine` runs on."""

    loaded: LoadedModel
    runner: ModelRunner
    scheduler: Scheduler
    max_model_len: int
    config: EngineConfig
    """The configuration as built: block size, number of blocks and ``max_model_len`` resolved."""
    proposer: Proposer | None = None
    """Speculative decoding's draft proposer (``None`` when off)."""
    batch_invariance: BatchInvariance | None = None
    """Whether this configuration is batch-invariant, and the parts that are not (see :func:`check_invariance`)."""


def meta_specs(source: ModelSource) -> tuple[Any, list[AttentionSpec]]:
    """The model config and per-layer attention specs, read from a weightless (meta-device) instance."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(source.directory), gguf_file=source.gguf_file)
    except (OSError, ValueError) as exc:
        where = source.directory / source.gguf_file if source.gguf_file else source.directory
        raise ConfigError(f"{where}: cannot read the model config ({exc})") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return config, layer_specs(model)


def _check(
    cls: type[AttentionBackend],
    specs: list[AttentionSpec],
    dtype: torch.dtype,
    block_size: int,
    kv_dtype: torch.dtype | None = None,
) -> None:
    """Refuse what ``cls`` does not declare; ``kv_dtype`` is the KV cache's dtype (``None``: ``dtype``)."""
    caps = cls.capabilities()
    for spec in dict.fromkeys(specs):
        caps.check(spec, dtype, block_size, kv_dtype)


def _kv_refusal(
    registry: BackendRegistry,
    cls: type[AttentionBackend],
    specs: list[AttentionSpec],
    dtype: torch.dtype,
    block_size: int,
    kv_dtype: torch.dtype,
) -> tuple[str, bool]:
    """What to add to a refusal of ``cls`` when it does not declare ``kv_dtype`` (the loaded backends that do),
    and whether the KV dtype alone refused it."""
    if kv_dtype in cls.capabilities().effective_kv_cache_dtypes:
        return "", False
    others = [
        r.name
        for r in registry.records()
        if r.status is BackendStatus.LOADED
        and r.backend_cls is not None
        and kv_dtype in r.backend_cls.capabilities().effective_kv_cache_dtypes
    ]
    try:
        _check(cls, specs, dtype, block_size)
        alone = True
    except UnsupportedConfigError:
        alone = False
    return f" (backends declaring KV dtype {kv_dtype_name(kv_dtype)}: {', '.join(others) or 'none loaded'})", alone


def choose_backend(
    config: EngineConfig, specs: list[AttentionSpec], packed_weights: bool = False
) -> tuple[type[AttentionBackend], torch.device, torch.dtype, int]:
    """The backend, device, dtype and block size to run with.

    An explicit backend must accept the model (else the error says why); the
    automatic choice takes the highest-priority available backend that does.
    ``packed_weights``: the linear weights will stay packed (see :func:`resolve_dtype`).
    The KV cache's dtype (``kv_cache_dtype``; ``auto`` is the compute dtype) is part of what a backend must
    declare: the automatic choice takes the best backend that declares it, with a warning naming the ones it
    passed over for that alone; an explicit backend that does not is refused, naming what it supports and
    which installed backends declare the dtype.
    """
    m = config.model
    kv_name = config.cache.kv_cache_dtype
    registry = load_registry()
    if m.backend:
        candidates = [registry.select(m.backend)]
    else:
        candidates = [r.backend_cls for r in registry.records() if r.status is BackendStatus.LOADED and r.backend_cls]
    refusals: list[tuple[str, str, bool]] = []  # (backend, why, refused for the KV dtype alone)
    for cls in candidates:
        device = torch.device(m.device or cls.availability().device)
        dtype = resolve_dtype(m.dtype, device, packed_weights)
        caps = cls.capabilities()
        if m.dtype == "auto" and dtype not in caps.dtypes and torch.float32 in caps.dtypes:
            dtype = torch.float32
        block_size = config.cache.block_size or caps.default_block_size
        kv_dtype = resolve_kv_dtype(kv_name, dtype)
        try:
            _check(cls, specs, dtype, block_size, kv_dtype)
        except UnsupportedConfigError as exc:
            hint, kv_alone = _kv_refusal(registry, cls, specs, dtype, block_size, kv_dtype)
            if m.backend:
                raise UnsupportedConfigError(f"backend {cls.name!r} cannot serve this model: {exc}{hint}") from None
            refusals.append((cls.name, f"{exc}{hint}", kv_alone))
            continue
        for name, why, kv_alone in refusals:  # the automatic choice passed over these: say why
            if kv_alone:  # a higher-priority backend lost for the KV dtype alone: a warning, not a -v line
                log.warning("backend %s skipped for kv_cache_dtype %s: %s; using %s", name, kv_name, why, cls.name)
            else:
                log.info("backend %s: %s cannot serve this model, skipped", name, why)
        return cls, device, dtype, block_size
    raise BackendUnavailableError(
        "no available backend can serve this model: " + "; ".join(f"{n}: {why}" for n, why, _ in refusals)
    )


def bytes_per_block(
    backend: AttentionBackend, specs: list[AttentionSpec], block_size: int, kv_dtype: torch.dtype
) -> int:
    """KV bytes one block costs across all layers, in the backend's own layout for KV dtype ``kv_dtype``
    (:meth:`~paged_core.contract.backend.AttentionBackend.kv_cache_shape_for`: a quantized cache's scales count)."""
    item = torch.empty((), dtype=kv_dtype).element_size()
    total = 0
    for s in [specs[i] for i in KVCacheGroups.from_specs(specs).tensor_layers()]:  # a block spans one group
        one = math.prod(backend.kv_cache_shape_for(1, block_size, s, kv_dtype))
        two = math.prod(backend.kv_cache_shape_for(2, block_size, s, kv_dtype))
        total += (two - one) * item
    return total


def _eos_ids(model: Any, tokenizer: Any | None) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
        if ids:
            break
    return tuple(ids)


@dataclass
class LoadedModel:
    """The expensive, reusable half of an engine: weights, tokenizer and the chosen backend."""

    source: ModelSource
    tokenizer: Any | None
    model: Any
    specs: list[AttentionSpec]
    backend: AttentionBackend
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    model_max_len: int
    decoders: dict[tuple[str, int], Any] = field(default_factory=dict)
    """Fused decoders built for this model, by (backend name, positions); shared by engines on these weights."""
    tp: TPGroup | None = None
    """This process's tensor-parallel rank when the model is split (its specs are then the rank's share)."""
    leader: Leader | None = None
    """Rank 0's workers and plan channel (``None`` on workers and without tensor parallelism)."""
    in_use: bool = False
    """A split model serves one engine: its workers mirror that engine's runner."""


def load(config: EngineConfig, group: TPGroup | None = None) -> LoadedModel:
    """Choose the backend for the model, then load tokenizer and weights onto its device.

    With ``tensor_parallel_size`` N > 1 the size is checked against the model's heads on the
    weightless config first; then rank 0 (``group`` None) forms the group, starting the workers
    for ``local``; a worker passes the group it joined. Every rank keeps its share of the weights
    (:mod:`paged_core.parallel.shard`).
    """
    # Plugins first: importing a backend's module may set process-wide switches (a Triton backend's interpreter
    # mode) that must act before transformers, below, imports triton.
    load_registry()
    source = resolve_source(config.model.model)
    if source.gguf_file is not None:
        check_gguf(source.directory / source.gguf_file)
    model_config, specs = meta_specs(source)
    tp = config.parallel.tensor_parallel_size
    check_tp_size(tp, specs, model_config)
    if config.parallel.enable_expert_parallel:
        check_ep(tp, model_config, specs)
    quant = config.model.quantization
    if tp > 1 and (quant == "int8" or (quant == "auto" and source.gguf_file is not None)):
        raise UnsupportedConfigError(
            f"tensor parallelism over packed (quantized) weights is not supported yet "
            f"(quantization={quant!r}{' on a GGUF' if quant == 'auto' else ''}); pass "
            "--quantization none to split the dequantized model, or run one rank"
        )
    specs = local_specs(specs, tp)
    cls, device, dtype, _ = choose_backend(config, specs, serves_packed(source, quant))
    leader: Leader | None = None
    if tp > 1:
        if group is None:
            leader = start_leader(config, device)
            group = leader.group
        elif group.device.type != device.type:
            raise ConfigError(
                f"rank {group.rank} joined the group for {group.device.type}, but the backend chose {device.type} here"
            )
    device = place(device, group.rank if group is not None else 0, tp)
    try:
        tokenizer = load_tokenizer(source) if group is None or group.rank == 0 else None
        model = load_model(source, model_config, dtype, device, register_paged_attention(), config.model.quantization)
        backend = cls(device=device)
        attach_ops(model, backend.fused_ops())
        if group is not None:
            assert not packed_modules(model)  # refused above, before any rank started
            shard_model(model, group)
            if config.parallel.enable_expert_parallel:
                _shard_experts(config, model, group)
            # Loading takes each rank its own time; the collectives that follow must not count it.
            if leader is not None:
                leader.barrier("loaded")
            else:
                group.barrier("loaded", STARTUP_TIMEOUT)
    except BaseException:
        if leader is not None:
            leader.close(timeout=1.0)
        raise
    limit = int(getattr(model_config.get_text_config(), "max_position_embeddings", 0) or 0) or 2**20
    return LoadedModel(
        source, tokenizer, model, specs, backend, dtype, _eos_ids(model, tokenizer), limit, tp=group, leader=leader
    )


def _shard_experts(config: EngineConfig, model: Any, group: TPGroup) -> None:
    """Expert parallel: keep this rank's experts; the fused decoder runs them (transformers' modules cannot)."""
    if model_path(config.model.model_impl, model) != "fused":
        why = fused_refusal(model) or "model_impl='transformers'"
        raise UnsupportedConfigError(f"enable_expert_parallel needs the fused decoder, which cannot run here: {why}")
    shard_experts(model, group.rank, group.world_size)


def _forward(config: EngineConfig, loaded: LoadedModel, max_model_len: int) -> ModelForward:
    reduce = loaded.tp.all_reduce if loaded.tp is not None else None
    return make_forward(
        config.model.model_impl,
        loaded.model,
        loaded.backend,
        loaded.specs,
        max_model_len + 1,
        loaded.decoders,
        reduce=reduce,
    )


def _lora_slots(config: EngineConfig, loaded: LoadedModel, forward: ModelForward) -> LoRASlots | None:
    """The adapter slots when ``enable_lora``; refuses, by name, what LoRA does not run with yet."""
    model = config.model
    if not model.enable_lora:
        return None
    if forward.name != "fused":
        raise UnsupportedConfigError(
            f"enable_lora needs the fused decoder, but this model runs on the {forward.name} path (model_impl)"
        )
    if config.graph.graph_mode in ("compiled", "device"):
        raise UnsupportedConfigError(
            f"enable_lora runs eagerly for now: graph_mode={config.graph.graph_mode!r} is refused (use auto or eager)"
        )
    if loaded.tp is not None and loaded.tp.world_size > 1:
        raise UnsupportedConfigError("enable_lora with tensor_parallel_size > 1 is not supported yet")
    shapes = model_shapes(loaded.model)
    max_rank = model.max_lora_rank

    def load(lora: LoRARequest) -> LoRAAdapter:
        return load_adapter(lora.name, lora.id, lora.path, shapes, max_rank)

    return LoRASlots(
        shapes,
        len(loaded.specs),
        model.max_loras,
        max_rank,
        loaded.dtype,
        loaded.backend.device,
        load,
    )


def _compile_cache(config: EngineConfig, loaded: LoadedModel) -> CompileCache:
    """The compiled-step cache of this exact configuration (see :mod:`paged_core.runner.compile_cache`)."""
    import importlib.metadata as md

    backend_cls = type(loaded.backend)
    dist = backend_cls.__module__.split(".")[0]
    try:
        version = md.version(dist.replace("_", "-"))
    except md.PackageNotFoundError:
        version = "unknown"
    source = loaded.source
    weights = source.directory / source.gguf_file if source.gguf_file else source.directory
    stat = weights.stat() if weights.exists() else None
    fields = {
        "model": str(weights),
        "model_mtime": stat.st_mtime if stat else None,
        "model_config": loaded.model.config.to_json_string(use_diff=False),
        "dtype": str(loaded.dtype),
        "kv_cache_dtype": config.cache.kv_cache_dtype,
        "backend": backend_cls.name,
        "backend_version": version,
        "device": loaded.backend.device.type,
        "model_impl": config.model.model_impl,
        "quantization": config.model.quantization,
        "torch": torch.__version__,
        "paged_core": __version__,
        # Ranks hold different shards (and sizes different shapes): each rank its own cache.
        "tensor_parallel": f"{loaded.tp.rank}/{loaded.tp.world_size}" if loaded.tp is not None else "1",
    }
    return CompileCache(fields, config.graph.compile_cache_dir)


def resolve(config: EngineConfig, loaded: LoadedModel, draft: LoadedModel | None = None) -> EngineConfig:
    """``config`` with what it left to the engine filled in: block size, number of blocks and ``max_model_len``.

    The block size defaults to the backend's; ``max_model_len`` to the model's
    limit (a larger one is capped, with a warning); the number of blocks comes
    from ``kv_cache_memory`` or, without it, from free memory after a
    profiling step, at the bytes a block costs in the KV dtype (``kv_cache_dtype``: an int8 cache holds about
    twice the blocks of a bf16 one). A draft model's KV (one block per target block) is paid from the same budget.
    """
    backend, specs, dtype = loaded.backend, loaded.specs, loaded.dtype
    cache, sched = config.cache, config.scheduler
    block_size = cache.block_size or type(backend).capabilities().default_block_size
    kv_dtype = resolve_kv_dtype(cache.kv_cache_dtype, dtype)
    limit = loaded.model_max_len
    max_model_len = min(sched.max_model_len or limit, limit)
    if sched.max_model_len and sched.max_model_len > limit:
        log.warning("max_model_len %d exceeds the model's %d; using %d", sched.max_model_len, limit, limit)
    num_blocks = cache.num_blocks
    if num_blocks is None:
        budget = cache.kv_cache_bytes
        if budget is None:
            peak = profile_peak_bytes(
                _forward(config, loaded, max_model_len),
                backend,
                specs,
                dtype,
                block_size,
                sched.max_num_batched_tokens,
                max_model_len,
                kv_dtype=kv_dtype,
            )
            budget = default_budget(backend.device_hooks(), cache.memory_fraction, peak)
            if loaded.tp is not None and backend.device.type == "cpu" and config.parallel.distributed_init == "local":
                budget //= loaded.tp.world_size  # the ranks share this host's RAM (an explicit budget is per rank)
        per_block = bytes_per_block(backend, specs, block_size, kv_dtype)
        if draft is not None:
            draft_kv = resolve_kv_dtype(cache.kv_cache_dtype, draft.dtype)
            per_block += bytes_per_block(draft.backend, draft.specs, block_size, draft_kv)
        num_blocks = blocks_for_memory(budget, per_block)
        if loaded.tp is not None:  # every rank sized its own budget; all run the count the tightest affords
            num_blocks = loaded.tp.min_int(num_blocks)
    lookahead = sched.num_lookahead_tokens
    if draft is not None:  # the draft writes KV for its drafts past the scheduled tokens
        lookahead = max(lookahead, config.speculative.num_speculative_tokens)
    return replace(
        config,
        cache=replace(cache, block_size=block_size, num_blocks=num_blocks),
        scheduler=replace(sched, max_model_len=max_model_len, num_lookahead_tokens=lookahead),
    )


def build_parts(config: EngineConfig, loaded: LoadedModel | None = None) -> EngineParts:
    """Size the KV cache and the scheduler around a (possibly already) loaded model."""
    if loaded is None:
        loaded = load(config)
        try:
            return _build(config, loaded)
        except BaseException:
            if loaded.leader is not None:  # our own workers: never leave them behind
                loaded.leader.close(timeout=1.0)
            raise
    if loaded.tp is not None and loaded.in_use:
        raise UnsupportedConfigError(
            "a tensor-parallel model serves one engine (its workers mirror that engine's "
            "runner); load it again for another"
        )
    # A model loaded under another configuration: this one's block size and KV dtype must be declared too (a
    # draft model is loaded afresh, through choose_backend).
    try:
        _check(
            type(loaded.backend),
            loaded.specs,
            loaded.dtype,
            config.cache.block_size or type(loaded.backend).capabilities().default_block_size,
            resolve_kv_dtype(config.cache.kv_cache_dtype, loaded.dtype),
        )
    except UnsupportedConfigError as exc:
        raise UnsupportedConfigError(f"backend {loaded.backend.name!r} cannot serve this model: {exc}") from None
    return _build(config, loaded)


def check_invariance(config: EngineConfig, loaded: LoadedModel, draft: LoadedModel | None = None) -> BatchInvariance:
    """The batch-invariance report of ``config`` on ``loaded`` (and a speculative draft model, whose drafts decide
    which sampled tokens are kept), logged in one line; refused when ``config.model.batch_invariant`` demands it."""
    backend = loaded.backend
    mode = resolve_graph_mode(config.graph.graph_mode, backend)
    tp = loaded.tp.world_size if loaded.tp is not None else 1

    def report(model: LoadedModel) -> BatchInvariance:
        return batch_invariance(
            type(model.backend).capabilities(),
            model.backend.fused_ops(),
            model_linear_kinds(model.model),
            backend=model.backend.name,
            model_path=model_path(config.model.model_impl, model.model),
            graph_mode=mode,
            tensor_parallel_size=tp,
            expert_kinds=model_expert_kinds(model.model),
        )

    invariance = report(loaded)
    if draft is not None:
        extra = tuple(
            VariantPart(f"draft model {p.part}", p.reason) for p in report(draft).variant if p not in invariance.variant
        )
        invariance = BatchInvariance(invariance.variant + extra, invariance.parts)
    log.info("%s", invariance.describe())
    if config.model.batch_invariant:
        invariance.require()
    return invariance


def _build(config: EngineConfig, loaded: LoadedModel) -> EngineParts:
    loaded.in_use = True
    draft = _load_draft(config, loaded)
    invariance = check_invariance(config, loaded, draft)
    config = resolve(config, loaded, draft)
    backend, specs, dtype = loaded.backend, loaded.specs, loaded.dtype
    cache, sched = config.cache, config.scheduler
    block_size, num_blocks, max_model_len = _resolved(config)
    groups = kv_cache_groups(config, loaded, draft)
    kv_dtype = resolve_kv_dtype(cache.kv_cache_dtype, dtype)
    kv_caches = _allocate_caches(backend, specs, groups, num_blocks, block_size, kv_dtype)
    forward = _forward(config, loaded, max_model_len)
    lora = _lora_slots(config, loaded, forward)
    scheduler = Scheduler(
        sched, cache, max_loras=config.model.max_loras if lora is not None else None, kv_groups=groups
    )
    proposer = _proposer(config, scheduler, draft)
    runner = ModelRunner(
        forward,
        backend,
        specs,
        kv_caches,
        block_size,
        max_num_tokens=sched.max_num_batched_tokens,
        max_num_reqs=sched.max_num_seqs,
        max_model_len=scheduler.max_len,
        graph_mode="eager" if lora is not None or groups.is_hybrid else config.graph.graph_mode,
        capture_sizes=config.graph.capture_sizes,
        piecewise=config.graph.piecewise,
        lora=lora,
        compile_cache=_compile_cache(config, loaded),
        layer_groups=groups.layer_group if groups.is_hybrid else (),
    )
    per_block = bytes_per_block(backend, specs, block_size, kv_dtype)
    log.info(
        "model %s (%s) on backend %s, device %s; KV cache: %d blocks of %d tokens, %s (%.2f GiB), "
        "at most %d tokens in flight; max_model_len %d",
        loaded.source.name,
        str(dtype).removeprefix("torch."),
        backend.name,
        backend.device,
        num_blocks - 1,
        block_size,
        describe_kv_dtype(kv_dtype),
        num_blocks * per_block / 2**30,
        (num_blocks - 1) * block_size,
        scheduler.max_len,
    )
    log.info("model path %s, graph mode %s", runner.forward_impl.name, runner.graph_mode)
    runner.warm_up()
    if runner.executor.stats.warmup_seconds:
        log.info("start-up %s took %.1f s", runner.graph_mode, runner.executor.stats.warmup_seconds)
    return EngineParts(loaded, runner, scheduler, scheduler.max_len, config, proposer, invariance)


def kv_cache_groups(config: EngineConfig, loaded: LoadedModel, draft: LoadedModel | None = None) -> KVCacheGroups:
    """The model's KV-cache groups, refusing what they cannot run with, by name.

    Several groups (a model mixing attention kinds) run eagerly, on a backend without a per-step ``prepare``
    plan (one plan would have to serve several block tables); a draft model shares the target's block
    tables, so it needs one full-attention group.
    """
    groups = KVCacheGroups.from_specs(loaded.specs)
    if groups.is_hybrid:
        kinds = sorted({str(g.sliding_window or "full") for g in groups.groups})
        what = f"{loaded.source.name} mixes attention kinds ({', '.join(kinds)}: {groups.num_groups} KV-cache groups)"
        if config.graph.graph_mode in ("compiled", "device"):
            raise UnsupportedConfigError(f"graph_mode={config.graph.graph_mode!r} refused: {what}, which runs eagerly")
        if type(loaded.backend).prepare is not AttentionBackend.prepare:
            raise UnsupportedConfigError(
                f"backend {loaded.backend.name!r} plans each step in prepare(), but {what}; use a backend without "
                f"a per-step plan (e.g. cpu, triton, reference)"
            )
    if draft is not None and groups.has_sliding:
        raise UnsupportedConfigError(
            f"speculative decoding with a draft model needs full attention on every layer of the target, and "
            f"{loaded.source.name} has sliding-window layers; use --speculative ngram"
        )
    return groups


def _allocate_caches(
    backend: AttentionBackend,
    specs: list[AttentionSpec],
    groups: KVCacheGroups,
    num_blocks: int,
    block_size: int,
    kv_dtype: torch.dtype,
) -> list[torch.Tensor]:
    """Each layer's cache: one tensor per layer of a group, shared by the same layer of every group."""
    tensors = [backend.allocate_kv_cache(num_blocks, block_size, specs[i], kv_dtype) for i in groups.tensor_layers()]
    return [tensors[groups.layer_tensor[i]] for i in range(len(specs))]


def _load_draft(config: EngineConfig, loaded: LoadedModel) -> LoadedModel | None:
    """The draft model speculation names (same backend and dtype as the target), checked against it."""
    spec = config.speculative
    if not spec.uses_draft_model:
        return None
    if loaded.tp is not None:
        raise UnsupportedConfigError(
            "speculative decoding with a draft model runs on one rank; use --speculative ngram with tensor parallelism"
        )
    draft = load(config.replace(model=spec.speculative, backend=loaded.backend.name, speculative=None))
    target_vocab = int(loaded.model.config.get_text_config().vocab_size)
    draft_vocab = int(draft.model.config.get_text_config().vocab_size)
    check_same_vocabulary(loaded.tokenizer, draft.tokenizer, target_vocab, draft_vocab)
    return draft


def _proposer(config: EngineConfig, scheduler: Scheduler, draft: LoadedModel | None) -> Proposer | None:
    """Speculation's proposer, with its settings checked against the context they run in."""
    spec, max_len = config.speculative, scheduler.max_len
    if spec.speculative is None:
        return None
    if spec.num_speculative_tokens >= max_len:
        raise ConfigError(
            f"num_speculative_tokens {spec.num_speculative_tokens} does not fit a context of "
            f"{max_len} tokens; use at most {max_len - 1} (typically 2-8)"
        )
    if draft is None:
        proposer = make_proposer(spec)
    else:
        if draft.model_max_len < max_len:
            raise ConfigError(
                f"speculative: the draft model's context ({draft.model_max_len}) is shorter than "
                f"max_model_len {max_len}; pass --max-model-len {draft.model_max_len}"
            )
        block_size, num_blocks = config.cache.require_resolved("speculative")
        sched = config.scheduler
        kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, draft.dtype)
        caches = [draft.backend.allocate_kv_cache(num_blocks, block_size, s, kv_dtype) for s in draft.specs]
        proposer = DraftModelProposer(
            _forward(config, draft, max_len),
            caches,
            scheduler.kv,
            block_size=block_size,
            max_num_tokens=sched.max_num_batched_tokens,
            max_num_reqs=sched.max_num_seqs,
            max_model_len=max_len,
            device=draft.backend.device,
            backend=draft.backend,
        )
    log.info("speculative decoding: %s, up to %d draft tokens per step", spec.speculative, spec.num_speculative_tokens)
    return proposer


def _resolved(config: EngineConfig) -> tuple[int, int, int]:
    """Block size, number of blocks and ``max_model_len`` of a resolved config."""
    block_size, num_blocks = config.cache.require_resolved("build_parts")
    return block_size, num_blocks, config.scheduler.require_resolved("build_parts")
