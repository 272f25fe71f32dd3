"""Finding the backend under test: by registry name, or ``module:Class`` for unregistered ones."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata

from paged_core.api import AttentionBackend, BackendNotFoundError


@dataclass(frozen=True)
class BackendInfo:
    """The backend class plus where it came from, for the report."""

    cls: type[AttentionBackend]
    name: str
    distribution: str | None
    version: str | None


def _distribution_of(cls: type) -> tuple[str | None, str | None]:
    top = cls.__module__.split(".")[0]
    dists = metadata.packages_distributions().get(top, [])
    if not dists:
        return None, None
    return dists[0], metadata.version(dists[0])


def _from_path(spec: str) -> type[AttentionBackend]:
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendNotFoundError(f"cannot load backend {spec!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, AttentionBackend)):
        raise BackendNotFoundError(f"{spec!r} is not an AttentionBackend subclass")
    return obj


def _from_registry(name: str) -> type[AttentionBackend]:
    from paged_core.registry import load_registry

    return load_registry().get(name)


def resolve_backend(spec: str) -> BackendInfo:
    """Resolve ``--backend``: a registered name, or ``package.module:ClassName``.

    Raises :class:`BackendNotFoundError` (or ``BackendUnavailableError`` from
    the registry) with a message saying why.
    """
    cls = _from_path(spec) if ":" in spec else _from_registry(spec)
    dist, version = _distribution_of(cls)
    return BackendInfo(cls=cls, name=getattr(cls, "name", cls.__name__), distribution=dist, version=version)
