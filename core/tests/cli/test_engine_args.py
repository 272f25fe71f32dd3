"""The engine flags are generated from EngineConfig's fields: every leaf has one, with its help and default."""

from __future__ import annotations

import argparse
from typing import Any, get_args

import pytest

from paged_core.cli.engine_args import add_engine_args, add_sampling_args, engine_config_from, engine_flag
from paged_core.cli.main import build_parser
from paged_core.engine_config import EngineConfig, FlatField, flat_fields
from paged_core.errors import ConfigError

# Flags users already type; they must keep working.
KEPT = (
    "--model",
    "--backend",
    "--dtype",
    "--kv-cache-memory",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-model-len",
    "--block-size",
    "--no-prefix-caching",
    "--no-chunked-prefill",
    "--model-impl",
    "--graph-mode",
    "--enforce-eager",
    "--capture-sizes",
    "--compile-cache-dir",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    add_sampling_args(parser)  # the sampling --seed must not clash with the engine's
    return parser


def _other_value(name: str, leaf: FlatField) -> tuple[list[str], Any]:
    """Command-line words that set ``name`` to something other than its default, and the value expected."""
    flag, kwargs = engine_flag(name, leaf)
    default, kinds = leaf.field.default, set(get_args(leaf.type)) or {leaf.type}
    if leaf.type is bool:
        return [flag], not default
    if leaf.type == bool | None:  # left to the engine unless --flag or --no-flag
        return [flag], True
    if "choices" in kwargs:
        value: Any = next(c for c in reversed(kwargs["choices"]) if c != default)
        return [flag, value], value
    if kinds & {tuple[int, ...]}:
        return [flag, "1,2,16"], (1, 2, 16)
    if float in kinds:
        return [flag, "0.5"], 0.5
    if kinds <= {int, type(None)}:
        return [flag, str((default or 2) + 1)], (default or 2) + 1
    return [flag, "2GiB" if name == "kv_cache_memory" else "x"], "2GiB" if name == "kv_cache_memory" else "x"


@pytest.mark.parametrize("name", list(flat_fields()))
def test_every_engine_field_is_reachable_by_a_flag(name: str) -> None:
    leaf = flat_fields()[name]
    argv, want = _other_value(name, leaf)
    assert want != leaf.field.default
    args = _parser().parse_args(argv)
    cfg = engine_config_from(args)
    assert getattr(getattr(cfg, leaf.section), name) == want
    assert cfg.replace(**{name: leaf.field.default}) == EngineConfig()  # nothing else moved


def test_no_flags_give_the_default_config() -> None:
    assert engine_config_from(_parser().parse_args([])) == EngineConfig()


def test_kept_flags_and_field_help() -> None:
    text = _parser().format_help()
    new = (
        "--engine-seed",
        "--trust-remote-code",
        "--policy",
        "--num-lookahead-tokens",
        "--hash-algorithm",
        "--memory-fraction",
        "--num-blocks",
        "--device",
    )
    for flag in (*KEPT, *new):
        assert flag in text
    assert "token budget of one step (default 2048)" in " ".join(text.split())


def test_enforce_eager_and_overrides() -> None:
    parser = _parser()
    assert engine_config_from(parser.parse_args(["--enforce-eager"])).graph.graph_mode == "eager"
    with pytest.raises(ConfigError, match="--enforce-eager contradicts --graph-mode compiled"):
        engine_config_from(parser.parse_args(["--enforce-eager", "--graph-mode", "compiled"]))
    args = parser.parse_args(["--seed", "5", "--engine-seed", "9"])
    assert (args.seed, engine_config_from(args).model.seed) == (5, 9)
    assert engine_config_from(args, max_num_seqs=3).scheduler.max_num_seqs == 3


def test_bad_values_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--capture-sizes", "1,x"])
    assert "--capture-sizes must be comma-separated ints, got '1,x'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="memory_fraction must be in"):
        engine_config_from(_parser().parse_args(["--memory-fraction", "2"]))


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_every_engine_command_takes_every_flag(command: str) -> None:
    extra = ["throughput"] if command == "bench" else []
    args = build_parser().parse_args([command, *extra, "--policy", "priority", "--num-lookahead-tokens", "1"])
    cfg = engine_config_from(args)
    assert (cfg.scheduler.policy, cfg.scheduler.num_lookahead_tokens) == ("priority", 1)


def test_batch_invariant_is_a_switch_off_by_default() -> None:
    flag, kwargs = engine_flag("batch_invariant", flat_fields()["batch_invariant"])
    assert flag == "--batch-invariant" and kwargs["action"] == "store_true" and "batch-invariant" in kwargs["help"]
    assert engine_config_from(_parser().parse_args(["--batch-invariant"])).model.batch_invariant is True
    assert EngineConfig().model.batch_invariant is False
    with pytest.raises(ConfigError, match="batch_invariant must be True or False"):
        EngineConfig.of(batch_invariant="yes")
