"""paged-core's extras: read from the installed metadata, followed through self-references, and the lazy
package attributes that need them."""

from __future__ import annotations

import importlib.metadata as md

import pytest

import paged_core
from paged_core import extras


def test_extras_come_from_the_installed_metadata() -> None:
    models = dict(extras.extra_requirements("models") or [])
    assert {"transformers", "gguf", "msgspec", "pyzmq"} <= set(models)
    serve = dict(extras.extra_requirements("serve") or [])
    assert serve["paged-core"] == ["models"] and "fastapi" in serve
    assert "torch" not in models  # a base requirement, not an extra's
    base = [r for r in md.requires("paged-core") or [] if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("=")[0] for r in base) == ["numpy", "pluggy", "psutil", "torch", "tqdm"]


def test_nothing_is_missing_in_the_development_environment() -> None:
    for extra in ("models", "serve", "bench", "all"):
        assert extras.missing_for(extra) == [], extra
    extras.require("all", "everything")


def test_missing_distributions_are_named_through_references(monkeypatch) -> None:
    absent = {"fastapi", "transformers"}
    monkeypatch.setattr(extras, "_installed", lambda dist: dist not in absent)
    assert sorted(extras.missing_for("bench")) == ["fastapi", "transformers"]
    assert extras.missing_for("models") == ["transformers"]
    with pytest.raises(extras.MissingExtraError, match=r"^paged serve needs paged-core\[serve\] "):
        extras.require("serve", "paged serve")


def test_unknown_extra_needs_nothing() -> None:
    assert extras.missing_for("no-such-extra") == []


def test_lazy_user_names_and_their_hint(monkeypatch) -> None:
    assert paged_core.LLM is __import__("paged_core.frontend.llm", fromlist=["LLM"]).LLM
    assert "SamplingParams" in dir(paged_core)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = paged_core.Nope  # type: ignore[attr-defined]
    # Without the [models] extra, a user's name says what to install instead of a bare ImportError.
    monkeypatch.delattr(paged_core, "EngineConfig", raising=False)
    real = __import__("importlib").import_module

    def failing(name: str, *args: object) -> object:
        if name == "paged_core.engine_config":
            raise ModuleNotFoundError("No module named 'msgspec'", name="msgspec")
        return real(name, *args)

    monkeypatch.setattr("importlib.import_module", failing)
    with pytest.raises(extras.MissingExtraError, match=r"paged_core.EngineConfig needs paged-core\[models\]"):
        _ = paged_core.EngineConfig
