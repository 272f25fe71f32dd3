"""``kv_cache_dtype``: its names, the flag, the backend's declaration, and what a block costs in it."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from paged_core.api import AttentionSpec, BackendCapabilities, BackendUnavailableError, UnsupportedConfigError
from paged_core.cli.engine_args import add_engine_args, engine_config_from
from paged_core.config import KV_CACHE_DTYPES, CacheConfig
from paged_core.contract.kv_quant import KV_CACHE_DTYPE_NAMES
from paged_core.engine_config import EngineConfig
from paged_core.errors import ConfigError
from paged_core.loading import build
from paged_core.loading.build import bytes_per_block, choose_backend, load, resolve
from paged_core.loading.kv_dtype import describe_kv_dtype, kv_dtype_name, resolve_kv_dtype
from paged_core.reference import ReferenceBackend
from paged_core.registry import BackendStatus

SMOL = [AttentionSpec(9, 3, 64)] * 30
"""The embedded SmolLM2-135M's layers: 9 query heads, 3 KV heads of 64."""


def test_the_config_names_are_the_contracts() -> None:
    assert KV_CACHE_DTYPES == tuple(KV_CACHE_DTYPE_NAMES)
    assert CacheConfig().kv_cache_dtype == "auto"


@pytest.mark.parametrize(
    ("name", "compute", "expected"),
    [
        ("auto", torch.bfloat16, torch.bfloat16),
        ("auto", torch.float32, torch.float32),
        ("bfloat16", torch.float32, torch.bfloat16),
        ("float32", torch.bfloat16, torch.float32),
        ("fp8", torch.bfloat16, torch.float8_e4m3fn),
        ("fp8_e4m3", torch.float32, torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float32, torch.float8_e5m2),
        ("int8", torch.float16, torch.int8),
    ],
)
def test_names_resolve_against_the_compute_dtype(name: str, compute: torch.dtype, expected: torch.dtype) -> None:
    assert resolve_kv_dtype(name, compute) == expected


def test_each_kv_dtype_has_one_name() -> None:
    assert kv_dtype_name(torch.float8_e4m3fn) == "fp8_e4m3"
    assert kv_dtype_name(torch.int8) == "int8" and kv_dtype_name(torch.bfloat16) == "bfloat16"
    assert describe_kv_dtype(torch.int8) == "int8 with per token-head fp16 scales"
    assert describe_kv_dtype(torch.float16) == "float16"
    with pytest.raises(ConfigError, match="not a KV cache dtype"):
        kv_dtype_name(torch.int32)


@pytest.mark.parametrize("bad", ["int4", "fp8_e4m3fn", "FP8", "", None, 8])
def test_an_unknown_value_is_refused_naming_the_allowed_ones(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"kv_cache_dtype must be one of auto, float32, .*fp8_e5m2, int8; got"):
        CacheConfig(kv_cache_dtype=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of"):
        EngineConfig.of(kv_cache_dtype=bad)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged generate", exit_on_error=False)
    add_engine_args(parser)
    return parser


def test_the_flag_sets_the_field() -> None:
    args = _parser().parse_args(["--kv-cache-dtype", "fp8", "--block-size", "32"])
    config = engine_config_from(args)
    assert config.cache.kv_cache_dtype == "fp8" and config.cache.block_size == 32
    assert engine_config_from(_parser().parse_args([])).cache.kv_cache_dtype == "auto"
    assert "--kv-cache-dtype" in _parser().format_help()


def test_the_flag_refuses_an_unknown_value_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="paged generate")
    add_engine_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])
    err = capsys.readouterr().err
    assert "--kv-cache-dtype: invalid choice: 'int4'" in err and "'fp8_e4m3'" in err and "'int8'" in err


# ---- bytes per block and the budget ------------------------------------------------------------------------------


def test_a_block_costs_the_kv_dtypes_bytes_and_a_quantized_one_its_scales() -> None:
    backend = ReferenceBackend()
    per_vector = {torch.float32: 64 * 4, torch.bfloat16: 64 * 2, torch.int8: 66, torch.float8_e5m2: 66}
    for dtype, vector in per_vector.items():
        # K and V, 16 tokens, 3 KV heads, 30 layers.
        assert bytes_per_block(backend, SMOL, 16, dtype) == 2 * 16 * 3 * vector * 30
    ratio = bytes_per_block(backend, SMOL, 16, torch.bfloat16) / bytes_per_block(backend, SMOL, 16, torch.int8)
    assert ratio == pytest.approx(128 / 66)  # about 1.94: twice the blocks, less the fp16 scale's 2 bytes of 66


class _TileBackend(ReferenceBackend):
    """A layout of its own (blocks and heads swapped) and scales kept apart: one float16 per vector elsewhere,
    which its ``kv_cache_shape_for`` counts as a slot of ``head_size + 2`` bytes, in int8 elements."""

    name = "tiles"

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (num_blocks, 2, num_kv_heads, block_size, head_size)

    def kv_cache_shape_for(
        self, num_blocks: int, block_size: int, spec: AttentionSpec, dtype: torch.dtype
    ) -> tuple[int, ...]:
        extra = 4 if dtype == torch.int8 else 0  # (say) a float32 scale per vector
        return self.kv_cache_shape(num_blocks, block_size, spec.num_kv_heads, spec.head_size + extra)


def test_the_budget_counts_the_backends_own_shape_for_the_kv_dtype() -> None:
    backend = _TileBackend()
    assert bytes_per_block(backend, SMOL, 16, torch.int8) == 2 * 16 * 3 * 68 * 30
    assert bytes_per_block(backend, SMOL, 16, torch.float16) == 2 * 16 * 3 * 128 * 30


def test_an_int8_cache_gets_about_twice_the_blocks_of_bf16_on_one_budget(tiny_model_dir: Path) -> None:
    config = EngineConfig.of(model=str(tiny_model_dir), backend="reference", dtype="bfloat16", kv_cache_memory="2MiB")
    loaded = load(config)
    blocks = {}
    for name in ("bfloat16", "auto", "int8", "fp8_e4m3", "float32"):
        resolved = resolve(config.replace(kv_cache_dtype=name), loaded)
        blocks[name] = resolved.cache.num_blocks
    # The tiny model: 2 layers of one KV head of 64; 16-token blocks: 8 KiB in bf16, 4,224 bytes in int8.
    assert blocks["bfloat16"] == blocks["auto"] == 2 * 2**20 // 8192 == 256
    assert blocks["int8"] == blocks["fp8_e4m3"] == 2 * 2**20 // 4224 == 496
    assert blocks["float32"] == 128
    assert 1.9 < blocks["int8"] / blocks["bfloat16"] < 2.0


# ---- the backend must declare it ------------------------------------------------------------------------------


class _NoInt8(ReferenceBackend):
    """A backend that declares float KV caches only."""

    name = "no-int8"
    priority = 90

    @classmethod
    def capabilities(cls) -> BackendCapabilities:
        floats = frozenset({torch.float32, torch.bfloat16, torch.float16})
        return dataclasses.replace(super().capabilities(), kv_cache_dtypes=floats)


class _Registry:
    """The registry's two calls ``choose_backend`` makes, over fixed backends (highest priority first)."""

    def __init__(self, *classes: type[ReferenceBackend]) -> None:
        self.classes = {c.name: c for c in classes}

    def records(self) -> list[Any]:
        return [SimpleNamespace(name=n, status=BackendStatus.LOADED, backend_cls=c) for n, c in self.classes.items()]

    def select(self, name: str) -> type[ReferenceBackend]:
        return self.classes[name]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> _Registry:
    reg = _Registry(_NoInt8, ReferenceBackend)
    monkeypatch.setattr(build, "load_registry", lambda: reg)
    return reg


def test_an_explicit_backend_refuses_an_undeclared_kv_dtype_naming_what_it_supports(registry: _Registry) -> None:
    config = EngineConfig.of(backend="no-int8", dtype="float32", kv_cache_dtype="int8")
    with pytest.raises(UnsupportedConfigError) as info:
        choose_backend(config, SMOL)
    assert str(info.value) == (
        "backend 'no-int8' cannot serve this model: kv_cache_dtype torch.int8 not supported (supported: bfloat16, "
        "float16, float32) (backends declaring KV dtype int8: reference)"
    )
    cls, _, dtype, _ = choose_backend(config.replace(kv_cache_dtype="bfloat16"), SMOL)  # declared: accepted
    assert cls is _NoInt8 and dtype == torch.float32


def test_the_automatic_choice_takes_a_backend_declaring_the_kv_dtype_and_warns(
    registry: _Registry, caplog: pytest.LogCaptureFixture
) -> None:
    config = EngineConfig.of(dtype="float32", kv_cache_dtype="fp8")
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        cls, _, _, _ = choose_backend(config, SMOL)
    assert cls is ReferenceBackend
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "backend no-int8 skipped for kv_cache_dtype fp8: kv_cache_dtype torch.float8_e4m3fn not supported "
        "(supported: bfloat16, float16, float32) (backends declaring KV dtype fp8_e4m3: reference); using reference"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        assert choose_backend(config.replace(kv_cache_dtype="auto"), SMOL)[0] is _NoInt8
    assert not caplog.records


def test_no_backend_declaring_it_is_an_error_naming_each_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "load_registry", lambda: _Registry(_NoInt8))
    with pytest.raises(
        BackendUnavailableError, match=r"no-int8: kv_cache_dtype torch.int8 not supported .*none loaded"
    ):
        choose_backend(EngineConfig.of(dtype="float32", kv_cache_dtype="int8"), SMOL)


def test_a_loaded_model_reconfigured_to_an_undeclared_kv_dtype_is_refused(tiny_model_dir: Path) -> None:
    config = EngineConfig.of(model=str(tiny_model_dir), backend="reference", dtype="float32", kv_cache_memory="1MiB")
    loaded = load(config)
    loaded = dataclasses.replace(loaded, backend=_NoInt8())
    assert resolve(config.replace(kv_cache_dtype="float16"), loaded).cache.num_blocks == 2**20 // 8192
    with pytest.raises(UnsupportedConfigError, match=r"backend 'no-int8' cannot serve this model: kv_cache_dtype"):
        build.build_parts(config.replace(kv_cache_dtype="int8"), loaded)


def test_the_engine_runs_and_reports_its_kv_dtype(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An int8 cache end to end on the tiny model: the core's facts and the start-up log name it."""
    from paged_core.frontend.llm_engine import LLMEngine
    from paged_core.sampling.params import SamplingParams

    config = EngineConfig.of(
        model=str(tiny_model_dir), backend="reference", dtype="float32", kv_cache_memory="1MiB", kv_cache_dtype="int8"
    )
    with caplog.at_level(logging.INFO, logger="paged.engine"):
        engine = LLMEngine(config)
    assert engine.facts.kv_cache_dtype == "int8" and engine.facts.dtype == "float32"
    assert engine.core.runner.kv_caches[0].dtype == torch.int8
    started = [r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage()]
    assert len(started) == 1 and "tokens, int8 with per token-head fp16 scales (" in started[0]
    engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert len(done[0].outputs[0].token_ids) == 4
    plain = LLMEngine(config.replace(kv_cache_dtype="auto"), engine.loaded)
    assert plain.facts.kv_cache_dtype == "float32"


def test_paged_backends_lists_kv_dtypes_that_differ_from_the_compute_dtypes() -> None:
    from paged_core.cli.backends import capabilities_summary

    assert capabilities_summary(ReferenceBackend.capabilities()).startswith(
        "dtypes bf16,fp16,fp32; kv bf16,fp16,fp32,fp8_e4m3,fp8_e5m2,int8; heads any;"
    )
    assert "kv " not in capabilities_summary(_NoInt8.capabilities())  # the same as its dtypes: not repeated


def test_a_draft_models_cache_is_in_the_kv_dtype_and_paid_from_the_budget(tiny_model_dir: Path) -> None:
    """Speculation with a draft model (the tiny model drafting for itself): both caches int8, one budget."""
    from paged_core.frontend.llm_engine import LLMEngine
    from paged_core.sampling.params import SamplingParams

    fields = dict(model=str(tiny_model_dir), backend="reference", dtype="float32", kv_cache_memory="1MiB")
    plain = LLMEngine(EngineConfig.of(**fields, kv_cache_dtype="int8"))
    engine = LLMEngine(EngineConfig.of(**fields, kv_cache_dtype="int8", speculative=str(tiny_model_dir)))
    proposer = engine.core.drafts.proposer
    assert proposer is not None
    assert {c.dtype for c in proposer.executor.kv_caches} == {c.dtype for c in engine.core.runner.kv_caches}
    assert engine.core.runner.kv_caches[0].dtype == torch.int8
    # The draft's blocks (the same model) cost as much again: half the blocks of the engine without one.
    per_block = bytes_per_block(ReferenceBackend(), [AttentionSpec(2, 1, 64)] * 2, 16, torch.int8)
    assert per_block == 2 * 2 * 16 * 66
    assert plain.core.scheduler.kv.pool.num_usable_blocks + 1 == 2**20 // per_block == 248
    assert engine.core.scheduler.kv.pool.num_usable_blocks + 1 == 2**20 // (2 * per_block) == 124
    engine.add_request([5, 6, 7, 8, 5, 6, 7], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
