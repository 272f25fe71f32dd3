"""Workload generation: seeded, deterministic, shaped as DESIGN.md defines each workload."""

from __future__ import annotations

import statistics

import pytest

from paged_bench import workloads as w


@pytest.mark.parametrize("name", list(w.WORKLOADS))
def test_same_seed_same_requests(name: str) -> None:
    assert w.build(name, seed=3) == w.build(name, seed=3)


@pytest.mark.parametrize("name", ["throughput", "prefix", "kv-util", "decode-1", "edit-1", "long"])
def test_other_seed_other_requests(name: str) -> None:
    assert w.build(name, seed=0) != w.build(name, seed=1)


@pytest.mark.parametrize("name", ["throughput", "prefix", "kv-util", "long"])
def test_fewer_requests_is_a_prefix_of_the_full_workload(name: str) -> None:
    assert w.build(name, 3) == w.build(name)[:3]


def test_default_sizes_match_the_design() -> None:
    sizes = {name: len(w.build(name)) for name in w.WORKLOADS}
    assert sizes == {"throughput": 256, "prefix": 64, "kv-util": 1000, "decode-1": 1, "edit-1": 1, "long": 8}


def test_edit_1_repeats_its_segment() -> None:
    (req,) = w.build("edit-1")
    ids = req.prompt_token_ids
    assert len(ids) == 3 * 48 + 8 and ids[:48] == ids[48:96] == ids[96:144] and ids[144:] == ids[:8]
    assert req.max_tokens == 128


def test_throughput_is_unchanged_by_the_extension() -> None:
    # Figures were already measured on this exact workload; pin its first request.
    first = w.throughput()[0]
    assert (len(first.prompt_token_ids), first.max_tokens) == (464, 223)
    assert first.prompt_token_ids[:3] == [25347, 27662, 2753]


def test_throughput_ranges() -> None:
    reqs = w.throughput()
    assert all(32 <= len(r.prompt_token_ids) <= 512 and 32 <= r.max_tokens <= 256 for r in reqs)
    assert all(w.TOKEN_LOW <= t < w.TOKEN_HIGH for r in reqs for t in r.prompt_token_ids)


def test_prefix_shares_exactly_the_system_prompt() -> None:
    reqs = w.prefix()
    shared = reqs[0].prompt_token_ids[:1024]
    assert all(len(r.prompt_token_ids) == 1024 + 64 and r.max_tokens == 32 for r in reqs)
    assert all(r.prompt_token_ids[:1024] == shared for r in reqs)
    suffixes = {tuple(r.prompt_token_ids[1024:]) for r in reqs}
    assert len(suffixes) == len(reqs)


def test_decode_1_and_long_shapes() -> None:
    (one,) = w.build("decode-1")
    assert one.max_tokens == 256
    assert all(len(r.prompt_token_ids) == 4096 and r.max_tokens == 128 for r in w.build("long"))
    with pytest.raises(ValueError, match="single request"):
        w.build("decode-1", 2)


def test_kv_util_lengths_are_sharegpt_like_and_fit_max_len() -> None:
    reqs = w.kv_util(max_len=2048)
    assert all(r.num_tokens <= 2048 and len(r.prompt_token_ids) <= 1024 for r in reqs)
    prompts = [len(r.prompt_token_ids) for r in reqs]
    outputs = [r.max_tokens for r in reqs]
    # Lognormal: a long right tail (mean well above median), means near ShareGPT's (clipping trims a little).
    assert statistics.mean(prompts) > 1.3 * statistics.median(prompts)
    assert 130 < statistics.mean(prompts) < 190
    assert 270 < statistics.mean(outputs) < 380
    small = w.kv_util(50, max_len=64)
    assert all(r.num_tokens <= 64 for r in small)


def test_cap_output() -> None:
    reqs = w.throughput(4)
    capped = w.cap_output(reqs, 40)
    assert [r.prompt_token_ids for r in capped] == [r.prompt_token_ids for r in reqs]
    assert [r.max_tokens for r in capped] == [min(40, r.max_tokens) for r in reqs]
    assert w.cap_output(reqs, None) is reqs
    with pytest.raises(ValueError, match="max_tokens"):
        w.cap_output(reqs, 0)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        w.build("nope")
    with pytest.raises(ValueError, match="num_requests"):
        w.throughput(0)
    with pytest.raises(ValueError, match="suffix_len"):
        w.prefix(suffix_len=0)


def test_fit_vocab_folds_ids_into_a_small_vocabulary() -> None:
    from paged_bench.workloads import TOKEN_HIGH, TOKEN_LOW, BenchRequest, fit_vocab

    requests = [BenchRequest([TOKEN_LOW, TOKEN_LOW + 7, TOKEN_LOW + 2 * 900 + 7, TOKEN_HIGH - 1], 5)]
    (folded,) = fit_vocab(requests, TOKEN_LOW + 900)
    assert folded.prompt_token_ids == [
        TOKEN_LOW,
        TOKEN_LOW + 7,
        TOKEN_LOW + 7,
        TOKEN_LOW + (TOKEN_HIGH - 1 - TOKEN_LOW) % 900,
    ]
    assert folded.max_tokens == 5
    assert fit_vocab(requests, TOKEN_HIGH) is requests  # a real vocabulary keeps the ids as drawn
    with pytest.raises(ValueError, match="no ids above"):
        fit_vocab(requests, TOKEN_LOW)
