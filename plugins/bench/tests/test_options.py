"""Bench options: baselines parsed and checked, bad values named."""

from __future__ import annotations

import pytest

from paged_bench.options import BenchOptions, parse_baselines


def test_parse_baselines() -> None:
    assert parse_baselines("hf-static, hf-cb,hf-static") == ("hf-static", "hf-cb")
    assert parse_baselines("") == ()
    assert parse_baselines("vllm,vllm-compiled") == ("vllm", "vllm-compiled")
    assert parse_baselines("eager,no-pieces") == ("eager", "no-pieces")
    with pytest.raises(
        ValueError,
        match=r"unknown baseline\(s\) sglang; choose from hf-static, hf-cb, reference, dequantized, eager, no-pieces, "
        r"vllm",
    ):
        parse_baselines("hf-cb,sglang")


def test_options_validate() -> None:
    assert not BenchOptions("kv-util").uses_model
    assert BenchOptions("long").to_dict()["kv_util"] is None
    with pytest.raises(ValueError, match="unknown workload 'speed'"):
        BenchOptions("speed")
    with pytest.raises(ValueError, match="num_requests must be an int >= 1"):
        BenchOptions("throughput", num_requests=0)
    with pytest.raises(ValueError, match="hf_batch"):
        BenchOptions("throughput", hf_batch=0)
