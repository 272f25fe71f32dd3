"""Module attributes imported on first use (PEP 562), for packages whose names need optional extras."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(
    package: str, names: dict[str, str], namespace: dict[str, Any], extra: str | None = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``names[name]`` on first access and caching it in ``namespace``.

    With ``extra``, an import that fails on a module outside paged-core raises
    :class:`paged_core.extras.MissingExtraError` saying to install ``paged-core[extra]``.
    """

    def __getattr__(name: str) -> Any:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            from paged_core.extras import from_import_error

            hint = from_import_error(exc, f"{package}.{name}", extra) if extra is not None else None
            if hint is None:
                raise
            raise hint from exc
        value = getattr(module, name)
        namespace[name] = value
        return value

    return __getattr__
