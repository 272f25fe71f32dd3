"""Text output: incremental detokenization and stop strings."""

from __future__ import annotations

from paged_core.text.detokenizer import IncrementalDetokenizer
from paged_core.text.stop import StopStringChecker

__all__ = ["IncrementalDetokenizer", "StopStringChecker"]
