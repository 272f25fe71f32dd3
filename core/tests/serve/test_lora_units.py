"""``--lora-modules`` parsing, the serve command's LoRA flags, and the adapter registry's ids and deferred unloads."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import msgspec
import pytest

from paged_core.cli.engine_args import engine_config_from
from paged_core.cli.serve import lora_overrides, register
from paged_core.engine_core.messages import CoreUtility, ToCore
from paged_core.errors import ConfigError
from paged_core.lora.request import LoRARequest
from paged_core.serve.errors import APIError
from paged_core.serve.lora import LoRARegistry
from paged_core.serve.lora_modules import RUNTIME_UPDATES_ENV, LoRAModule, parse_lora_module
from paged_core.serve.settings import ServeConfig


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("sql=/adapters/sql", LoRAModule("sql", "/adapters/sql")),
        (" sql = /a=b ", LoRAModule("sql", "/a=b")),  # only the first '=' splits
        ('{"name": "sql", "path": "/adapters/sql"}', LoRAModule("sql", "/adapters/sql")),
        (
            '{"name": "sql", "path": "/adapters/sql", "base_model_name": "qwen"}',
            LoRAModule("sql", "/adapters/sql", "qwen"),
        ),
    ],
)
def test_lora_modules_parse_both_forms(text: str, want: LoRAModule) -> None:
    assert parse_lora_module(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/adapters/sql", "name=path or a JSON object"),
        ("=/adapters/sql", "name=path or a JSON object"),
        ("sql=", "name=path or a JSON object"),
        ('{"name": "sql"', "not valid JSON"),
        ('{"name": "sql"}', "missing path"),
        ('{"name": "sql", "path": "/p", "rank": 8}', "unknown key(s) rank"),
        ('{"name": "", "path": "/p"}', "name must be a non-empty string"),
        ('{"name": "sql", "path": 3}', "path must be a non-empty string"),
    ],
)
def test_bad_lora_modules_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_lora_module(text)


def test_serve_config_refuses_a_name_twice_or_the_base_models_name() -> None:
    a, b = LoRAModule("a", "/x"), LoRAModule("a", "/y")
    with pytest.raises(ConfigError, match="'a' is given twice"):
        ServeConfig(lora_modules=(a, b))
    with pytest.raises(ConfigError, match="base model's served name"):
        ServeConfig(served_model_name="a", lora_modules=(a,))


def _serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_lora_modules_turn_enable_lora_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_UPDATES_ENV, raising=False)
    args = _serve_args(["/m", "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}', "--lora-modules", "c=/z"])
    assert [m.name for m in args.lora_modules] == ["a", "b", "c"]
    assert not args.enable_lora_runtime_updates
    assert engine_config_from(args, **lora_overrides(args)).model.enable_lora
    plain = _serve_args(["/m"])
    assert plain.lora_modules == [] and not engine_config_from(plain, **lora_overrides(plain)).model.enable_lora
    explicit = _serve_args(["/m", "--enable-lora", "--max-loras", "2", "--lora-modules", "a=/x"])
    config = engine_config_from(explicit, **lora_overrides(explicit)).model
    assert config.enable_lora and config.max_loras == 2


def test_runtime_updates_flag_and_vllm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_UPDATES_ENV, raising=False)
    args = _serve_args(["/m", "--enable-lora-runtime-updates"])
    assert args.enable_lora_runtime_updates and engine_config_from(args, **lora_overrides(args)).model.enable_lora
    for value, on in (("True", True), ("1", True), ("false", False), ("0", False)):
        monkeypatch.setenv(RUNTIME_UPDATES_ENV, value)
        assert _serve_args(["/m"]).enable_lora_runtime_updates is on, value


def test_a_bad_module_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _serve_args(["/m", "--lora-modules", "no-path-here"])
    assert exc.value.code == 2
    assert "--lora-modules" in capsys.readouterr().err


def test_utility_args_cross_the_socket() -> None:
    # A core process reads its utility calls as msgpack: the adapter's fields must come back as sent.
    encoded = msgspec.msgpack.encode(CoreUtility(7, "load_lora", ("sql", 3, "/adapters/sql")))
    decoded = msgspec.msgpack.decode(encoded, type=ToCore)
    assert isinstance(decoded, CoreUtility) and decoded == CoreUtility(7, "load_lora", ("sql", 3, "/adapters/sql"))
    name, lora_id, path = decoded.args
    assert isinstance(name, str) and isinstance(lora_id, int) and isinstance(path, str)


class _Engine:
    """What the registry calls: loads refuse paths starting with 'bad'."""

    def __init__(self) -> None:
        self.loaded: list[LoRARequest] = []
        self.removed: list[int] = []

    async def load_lora(self, lora: LoRARequest) -> str | None:
        if lora.path.startswith("bad"):
            return f"LoRA adapter {lora.name!r} ({lora.path}): no such directory"
        self.loaded.append(lora)
        return None

    async def remove_lora(self, lora_id: int) -> None:
        self.removed.append(lora_id)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_ids_are_given_in_order_and_never_reused() -> None:
    async def go() -> list[int]:
        engine = _Engine()
        registry = LoRARegistry(engine, "base")  # type: ignore[arg-type]
        await registry.load("a", "/a")
        await registry.load("b", "/b")
        with pytest.raises(APIError) as bad:
            await registry.load("c", "bad/c")
        assert bad.value.status == 400 and "'c' (bad/c): no such directory" in bad.value.message
        assert "c" not in registry.adapters
        await registry.unload("a")
        again = await registry.load("a", "/a2")  # a new id: the old one's prefix blocks must not be hit
        assert registry.resolve("a") == again and registry.resolve("base") is None
        return [lora.id for lora in engine.loaded]

    assert _run(go()) == [1, 2, 4]


def test_names_taken_and_unknown() -> None:
    async def go() -> None:
        registry = LoRARegistry(_Engine(), "base")  # type: ignore[arg-type]
        await registry.load("a", "/a")
        for name in ("a", "base"):
            with pytest.raises(APIError) as taken:
                await registry.load(name, "/x")
            assert taken.value.status == 400 and taken.value.param == "lora_name"
        with pytest.raises(APIError) as missing:
            await registry.unload("zz")
        assert missing.value.status == 404 and "'zz' is not loaded" in missing.value.message
        with pytest.raises(APIError) as unknown:
            registry.resolve("zz")
        assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
        assert "'zz' does not exist; this server serves 'base', 'a'" in unknown.value.message

    _run(go())


def test_an_unload_waits_for_the_requests_running_on_the_adapter() -> None:
    async def go() -> None:
        engine = _Engine()
        registry = LoRARegistry(engine, "base")  # type: ignore[arg-type]
        lora = await registry.load("a", "/a")
        registry.acquire(lora)
        registry.acquire(lora)
        await registry.unload("a")
        assert engine.removed == []  # two requests still run on it
        with pytest.raises(APIError) as gone:  # a request resolved before the unload cannot start on it
            registry.acquire(lora)
        assert gone.value.status == 404
        registry.release(lora)
        await asyncio.sleep(0)
        assert engine.removed == []
        registry.release(lora)
        await asyncio.sleep(0)
        assert engine.removed == [lora.id]
        other = await registry.load("b", "/b")
        await registry.unload("b")  # nothing runs on it: forgotten at once
        assert engine.removed == [lora.id, other.id]

    _run(go())


def test_a_failing_start_up_module_names_the_adapter() -> None:
    async def go() -> None:
        registry = LoRARegistry(_Engine(), "base")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"--lora-modules b: LoRA adapter 'b' \(bad/b\): no such directory"):
            await registry.load_modules([LoRAModule("a", "/a"), LoRAModule("b", "bad/b")])
        assert list(registry.adapters) == ["a"]

    _run(go())
