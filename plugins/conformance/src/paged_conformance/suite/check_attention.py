"""Paged attention against the oracle over the declared grid of dtypes, sizes, batch kinds and layouts."""

from __future__ import annotations

import pytest

from paged_conformance.grid import Case
from paged_conformance.harness import check_layers
from paged_conformance.session import Conformance


@pytest.mark.paged_cases("attention")
def test_attention(conformance: Conformance, case: Case) -> None:
    """Every batch kind, length edge, layer shape, scale, KV-cache dtype and input layout matches the oracle.

    Each case is one step of two layers (one ``prepare``, a ``forward`` per
    layer); the metadata must come back untouched and blocks no row owns must
    stay unwritten.
    """
    check_layers(conformance, case)
