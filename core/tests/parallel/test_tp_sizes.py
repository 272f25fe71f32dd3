"""Tensor-parallel sizes: refused before any weight loads, naming the counts and the sizes that work."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paged_core.contract.capabilities import AttentionSpec
from paged_core.errors import UnsupportedConfigError
from paged_core.parallel.tp_sizes import check_tp_size, local_specs, working_sizes


def _specs(heads: int, kv: int, layers: int = 2) -> list[AttentionSpec]:
    return [AttentionSpec(heads, kv, 64) for _ in range(layers)]


def test_working_sizes_divide_heads_kv_heads_and_the_mlp() -> None:
    assert working_sizes(_specs(9, 3), 1536) == [1, 3]  # the embedded SmolLM2-135M
    assert working_sizes(_specs(32, 8), 14336) == [1, 2, 4, 8]
    assert working_sizes(_specs(4, 2), 256) == [1, 2]
    assert working_sizes(_specs(4, 4), 6) == [1, 2]  # the MLP width limits it


def test_a_size_that_does_not_divide_is_refused_with_the_counts_and_what_works() -> None:
    config = SimpleNamespace(intermediate_size=1536)
    with pytest.raises(UnsupportedConfigError) as info:
        check_tp_size(2, _specs(9, 3), config)
    text = str(info.value)
    assert "tensor_parallel_size=2" in text and "9 attention heads and 3 KV heads" in text
    assert text.endswith("sizes that work: 1, 3")
    check_tp_size(3, _specs(9, 3), config)
    check_tp_size(1, _specs(9, 3), config)


def test_local_specs_hold_each_rank_s_share() -> None:
    (spec,) = local_specs([AttentionSpec(8, 4, 64, scale=0.1, sliding_window=128)], 2)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_size, spec.scale, spec.sliding_window) == (4, 2, 64, 0.1, 128)
