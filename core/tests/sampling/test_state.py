"""SamplingState: construction checks, stop ids, generators."""

from __future__ import annotations

import pytest
import torch

from paged_core.sampling import SamplingParams, SamplingState

from .helpers import make_state


def test_constructor_checks() -> None:
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        SamplingState({"temperature": 0}, [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="index must be an int >= 0, got -1"):
        SamplingState(SamplingParams(), [1], index=-1)


def test_stop_ids_merge_eos_unless_ignored() -> None:
    assert make_state(eos=[2, 7], stop_token_ids=[7, 9]).stop_ids == (2, 7, 9)
    assert make_state(eos=[2], stop_token_ids=[9], ignore_eos=True).stop_ids == (9,)


def test_min_tokens_mask_tracks_outputs() -> None:
    state = make_state(eos=[2], min_tokens=2)
    assert state.needs_min_tokens_mask
    state.append(5)
    state.append(2)
    assert not state.needs_min_tokens_mask and state.num_output_tokens == 2
    assert not make_state(min_tokens=3).needs_min_tokens_mask  # nothing to mask


def test_generator_needs_a_seed_and_one_device() -> None:
    with pytest.raises(ValueError, match=r"needs params\.seed"):
        make_state().generator(0, torch.device("cpu"))
    state = make_state(seed=1)
    gen = state.generator(2, torch.device("cpu"))
    assert state.generator(2, torch.device("cpu")) is gen
    with pytest.raises(ValueError, match="first sampled on cpu, now asked on meta"):
        state.generator(0, torch.device("meta"))


def test_fork_hands_over_the_used_stream() -> None:
    parent = make_state(seed=4)
    gen = parent.generator(1, torch.device("cpu"))
    child = parent.fork(1)
    assert child.generator(0, torch.device("cpu")) is gen
    assert parent.generator(1, torch.device("cpu")) is not gen
