"""What beam search refuses, and how each refusal names the field and what would work (no model needed)."""

from __future__ import annotations

from typing import Any

import pytest

from paged_core.engine_core.beam_params import BeamParams, BeamRequestError, check_beam
from paged_core.sampling.params import SamplingParams

GREEDY = {"temperature": 0.0, "n": 2}


@pytest.mark.parametrize(
    ("beam", "params", "field", "words"),
    [
        (BeamParams(0), GREEDY, "beam_width", "in [1, 8]"),
        (BeamParams(9), GREEDY, "beam_width", "max_num_seqs"),
        (BeamParams(True), GREEDY, "beam_width", "an int"),  # type: ignore[arg-type]
        (BeamParams(2, float("inf")), GREEDY, "length_penalty", "finite"),
        (BeamParams(2, early_stopping="sometimes"), GREEDY, "early_stopping", "'never'"),
        (BeamParams(2), {"temperature": 0.0, "n": 3}, "n", "at most the beam width (2)"),
        (BeamParams(2), {"n": 2}, "temperature", "set temperature 0"),
        (BeamParams(2), {**GREEDY, "top_p": 0.9}, "top_p", "leave top_p at 1"),
        (BeamParams(2), {**GREEDY, "top_k": 3}, "top_k", "0 or -1"),
        (BeamParams(2), {**GREEDY, "min_p": 0.1}, "min_p", "leave min_p at 0"),
        (BeamParams(2), {**GREEDY, "seed": 7}, "seed", "leave seed unset"),
        (BeamParams(2), {**GREEDY, "presence_penalty": 0.5}, "presence_penalty", "leave it at 0"),
        (BeamParams(2), {**GREEDY, "logprobs": 2}, "logprobs", "cumulative_logprob"),
        (BeamParams(2), {**GREEDY, "stop": "x"}, "stop", "stop_token_ids"),
    ],
)
def test_refusals_name_the_field(beam: BeamParams, params: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(BeamRequestError) as info:
        check_beam(SamplingParams(**params), beam, max_num_seqs=8)
    assert info.value.param == field
    assert field in str(info.value) and words in str(info.value)


def test_what_beam_search_honours_passes() -> None:
    ok = SamplingParams(n=2, temperature=0.0, max_tokens=5, min_tokens=2, ignore_eos=True, stop_token_ids=[7])
    for early in (False, True, "never"):
        check_beam(ok, BeamParams(4, -0.5, early), max_num_seqs=8)
    check_beam(SamplingParams(n=1, temperature=0.0, top_k=-1), BeamParams(8), max_num_seqs=8)
