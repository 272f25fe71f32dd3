"""Plugin API version and the compatibility promise.

The promise (N/N+1): a backend built against plugin API major version ``N``
keeps loading, unchanged, on every core release whose
:data:`PLUGIN_API_VERSION` is ``N`` or ``N + 1``. Within one major version the
contract only grows: new optional hooks get defaults, new metadata fields are
appended, nothing is removed or renamed. A core that moves to ``N + 2``
drops ``N`` and the registry reports such a backend as an API mismatch.

Versions that carry it: paged-core ``0.N.M`` implements plugin API ``N`` (``M`` counts
releases within it), so a backend written for API ``N`` requires
``paged-core>=0.N,<0.(N+2)`` and sets ``api_version = N`` in its class body (there is no
default). ``paged --version``, ``paged backends --json`` and ``paged-conformance --version``
print the API version next to the package versions.
"""

from __future__ import annotations

PLUGIN_API_VERSION: int = 1
"""The contract version this core implements."""

SUPPORTED_PLUGIN_API_VERSIONS: frozenset[int] = frozenset({PLUGIN_API_VERSION, PLUGIN_API_VERSION - 1} - {0})
"""Backend ``api_version`` values this core accepts (``N`` and ``N - 1``)."""
