"""Finding the backend under test: by registry name, or ``module:Class`` for unregistered ones."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata

from paged_core.api import AttentionBackend, Availability, BackendCapabilities, BackendNotFoundError, GraphSupport


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


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for errors that must fit on one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _from_path(spec: str) -> type[AttentionBackend]:
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        raise BackendNotFoundError(f"cannot load backend {spec!r}: {one_line(exc)}") from exc
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


def check_declarations(info: BackendInfo) -> Availability:
    """Call the backend's class hooks once; raise :class:`BackendNotFoundError` with one line if they are unusable.

    ``availability()`` and ``capabilities()`` may raise or return the wrong
    types; either would otherwise surface as a pytest INTERNALERROR.
    """
    for hook, want in (("availability", Availability), ("capabilities", BackendCapabilities)):
        try:
            value = getattr(info.cls, hook)()
        except Exception as exc:
            raise BackendNotFoundError(f"backend {info.name!r}: {hook}() raised {one_line(exc)}") from exc
        if not isinstance(value, want):
            raise BackendNotFoundError(
                f"backend {info.name!r}: {hook}() returned {type(value).__name__}, not {want.__name__}"
            )
    caps = info.cls.capabilities()
    if not isinstance(caps.graph_support, GraphSupport):
        raise BackendNotFoundError(
            f"backend {info.name!r}: capabilities().graph_support must be a GraphSupport member, "
            f"got {type(caps.graph_support).__name__} {caps.graph_support!r}"
        )
    avail: Availability = info.cls.availability()
    return avail
