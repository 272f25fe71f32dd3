"""Optional parts of paged-core and the hint a user gets when one is not installed.

``pip install paged-core`` is what a backend vendor needs: the contract, the registry, the
reference backend and the graph strategies (torch, pluggy, psutil, tqdm). The engine with
its model loaders, the server and the benchmarks are extras declared in ``pyproject.toml``
(``[models]``, ``[serve]``, ``[bench]``, ``[all]``). This module reads those declarations
from the installed distribution's metadata, so the lists live in one place.
"""

from __future__ import annotations

import importlib.metadata as md
import re

from paged_core.errors import PagedError

DISTRIBUTION = "paged-core"

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class MissingExtraError(PagedError, ImportError):
    """A feature needs an optional part of paged-core that is not installed; the message says what to install."""

    def __init__(self, feature: str, extra: str, missing: list[str]) -> None:
        self.feature, self.extra, self.missing = feature, extra, missing
        super().__init__(
            f"{feature} needs paged-core[{extra}] (missing: {', '.join(missing)}); "
            f"install it with: pip install 'paged-core[{extra}]'"
        )


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(dist: str) -> bool:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


def extra_requirements(extra: str) -> list[tuple[str, list[str]]] | None:
    """``(distribution, its extras)`` for each requirement of ``extra``, from the installed metadata.

    ``None`` when paged-core's metadata cannot be read (running from a source tree), so callers
    fall back to trying the import.
    """
    try:
        requires = md.requires(DISTRIBUTION)
    except md.PackageNotFoundError:
        return None
    out: list[tuple[str, list[str]]] = []
    for req in requires or []:
        requirement, _, marker = req.partition(";")
        marked = _EXTRA_MARKER.search(marker)
        if marked is None or _normalize(marked.group(1)) != _normalize(extra):
            continue
        match = _NAME.match(requirement)
        if match is None:
            continue
        inner = match.group(2)
        extras = [e.strip() for e in inner[1:-1].split(",") if e.strip()] if inner else []
        out.append((match.group(1), extras))
    return out


def missing_for(extra: str) -> list[str]:
    """Distributions that ``extra`` needs and that are not installed (following ``paged-core[...]`` references)."""
    missing: list[str] = []
    seen: set[str] = set()

    def walk(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dist, inner in extra_requirements(name) or []:
            if _normalize(dist) == DISTRIBUTION:
                for sub in inner:
                    walk(sub)
            elif not _installed(dist) and dist not in missing:
                missing.append(dist)

    walk(extra)
    return missing


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` naming every distribution ``feature`` lacks from ``paged-core[extra]``."""
    missing = missing_for(extra)
    if missing:
        raise MissingExtraError(feature, extra, missing)


def from_import_error(exc: ImportError, feature: str, extra: str) -> MissingExtraError | None:
    """The hint for ``feature`` (part of ``paged-core[extra]``) when its import failed on a module outside
    paged-core, or ``None`` when the failure is paged-core's own (a bug, which should stay a traceback)."""
    name = getattr(exc, "name", None) or ""
    if not name or name.partition(".")[0] == "paged_core":
        return None
    missing = missing_for(extra) or [name.partition(".")[0]]
    return MissingExtraError(feature, extra, missing)
