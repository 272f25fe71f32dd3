"""Sampling: request parameters, per-sequence state and the batched sampler."""

from __future__ import annotations

from paged_core.sampling.logprobs import TokenLogprobs
from paged_core.sampling.params import SamplingParams
from paged_core.sampling.sampler import Sampler, SamplerOutput
from paged_core.sampling.state import SamplingState

__all__ = ["Sampler", "SamplerOutput", "SamplingParams", "SamplingState", "TokenLogprobs"]
