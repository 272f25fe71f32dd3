"""Registers the reference backend with the backend registry (a pluggy hook implementation)."""

from __future__ import annotations

from paged_core.reference.backend import ReferenceBackend
from paged_core.registry.hookspecs import hookimpl


@hookimpl
def paged_register_backends() -> list[type[ReferenceBackend]]:
    """The backends this module provides: only the reference backend."""
    return [ReferenceBackend]
