"""``--dtype auto``: bf16 where bf16 math is fast, fp32 on CPUs for packed (quantized) linear weights."""

from __future__ import annotations

import pytest
import torch

from paged_core.errors import ConfigError
from paged_core.loading import dtype as dtype_mod
from paged_core.loading.dtype import resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_auto_on_a_cpu_follows_bf16_support_for_dense_weights(monkeypatch: pytest.MonkeyPatch, fast_bf16: bool) -> None:
    monkeypatch.setattr(dtype_mod, "cpu_has_fast_bf16", lambda: fast_bf16)
    assert resolve_dtype("auto", CPU) == (torch.bfloat16 if fast_bf16 else torch.float32)


def test_auto_on_a_cpu_is_fp32_for_packed_weights_even_with_fast_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtype_mod, "cpu_has_fast_bf16", lambda: True)
    assert resolve_dtype("auto", CPU, packed_weights=True) == torch.float32
    assert resolve_dtype("bfloat16", CPU, packed_weights=True) == torch.bfloat16  # asked for: kept
    assert resolve_dtype("auto", torch.device("cuda"), packed_weights=True) == torch.bfloat16


def test_an_unknown_dtype_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="auto, bfloat16, float16, float32; got 'fp8'"):
        resolve_dtype("fp8", CPU)
