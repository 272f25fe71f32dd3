"""paged-conformance: the suite every paged attention backend runs.

Run it with ``paged-conformance run --backend NAME`` (see :mod:`paged_conformance.cli`)
or in-process with :func:`run`. The JSON report's layout is documented in the
package README; :data:`SCHEMA_VERSION` names its version.
"""

from __future__ import annotations

from paged_conformance.cli import main, run
from paged_conformance.expectations import Expectation, ExpectationsError, load_expectations, parse_expectations
from paged_conformance.report import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "Expectation",
    "ExpectationsError",
    "load_expectations",
    "main",
    "parse_expectations",
    "run",
]
