"""The sampler: turns one step's logits into token ids (and logprobs) for every row.

Processing order per row: penalties -> temperature -> min_tokens mask ->
top-k -> top-p -> min-p -> draw. Greedy rows take the argmax after the
penalties and the min_tokens mask (temperature and truncation cannot change
it). A batch that is all greedy, unpenalised and past ``min_tokens`` is a
single ``argmax``. Each draw is an inverse-CDF lookup of one uniform number:
seeded rows take theirs from their own generator, so their tokens never
depend on the batch, and no vocabulary-sized noise is generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_core.sampling.draw import inverse_cdf
from paged_core.sampling.filters import keep_threshold
from paged_core.sampling.logprobs import TokenLogprobs, compute_logprobs
from paged_core.sampling.penalties import apply_penalties, mask_stop_ids
from paged_core.sampling.rows import take_rows
from paged_core.sampling.state import SamplingState

# SamplingState is re-exported: callers build states next to the sampler.
__all__ = ["Sampler", "SamplerOutput", "SamplingState"]


@dataclass(slots=True)
class SamplerOutput:
    """Per row of the batch: the drawn token ids and, if the request asked, their logprobs.

    ``token_ids[i]`` has ``num_samples[i]`` entries (1 by default);
    ``logprobs[i]`` is ``None`` for rows whose ``params.logprobs`` is None,
    else one :class:`TokenLogprobs` per sample.
    """

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]


def _check_inputs(logits: torch.Tensor, states: Sequence[SamplingState], num_samples: Sequence[int] | None) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point tensor [batch, vocab]; got {shape}")
    if len(states) != logits.shape[0]:
        raise ValueError(f"got {len(states)} sampling states for {logits.shape[0]} logits rows")
    if logits.shape[1] == 0:
        raise ValueError("logits have an empty vocabulary dimension")
    for i, state in enumerate(states):
        if not isinstance(state, SamplingState):
            raise TypeError(f"states[{i}] must be a SamplingState, got {type(state).__name__}")
    if num_samples is not None:
        if len(num_samples) != len(states):
            raise ValueError(f"num_samples has {len(num_samples)} entries for {len(states)} rows")
        for i, k in enumerate(num_samples):
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"num_samples[{i}] must be an int >= 1, got {k!r}")


class Sampler:
    """Draws tokens for a batch of rows, each with its own :class:`SamplingState`.

    ``seed`` seeds the one generator shared by all unseeded rows (None: seeded
    from the OS). Rows with ``params.seed`` use their state's own streams.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}

    def shared_generator(self, device: torch.device) -> torch.Generator:
        """The generator of unseeded rows on ``device``."""
        gen = self._shared.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self._seed is None:
                gen.seed()
            else:
                gen.manual_seed(self._seed)
            self._shared[device] = gen
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        states: Sequence[SamplingState],
        num_samples: Sequence[int] | None = None,
    ) -> SamplerOutput:
        """Draw ``num_samples[i]`` tokens (default 1) from row ``i`` of ``logits`` [B, V].

        Sample ``j`` of row ``i`` uses stream ``states[i].index + j`` when the
        request is seeded (see :class:`SamplingState`). ``logits`` may be any
        float dtype and is never modified; the work is done in fp32. The
        states are read, not updated: the engine appends accepted tokens.
        """
        _check_inputs(logits, states, num_samples)
        counts = [1] * len(states) if num_samples is None else list(num_samples)
        # Flattened samples: sample p comes from row sample_rows[p] as that row's sample_index[p]-th draw.
        sample_rows = [i for i, k in enumerate(counts) for _ in range(k)]
        sample_index = [j for k in counts for j in range(k)]

        if all(s.params.is_greedy and not s.params.has_penalties and not s.needs_min_tokens_mask for s in states):
            best = logits.argmax(dim=-1)
            tokens = best if num_samples is None else best.repeat_interleave(torch.tensor(counts, device=best.device))
        else:
            tokens = self._draw(logits, states, sample_rows, sample_index)
        return self._output(logits, states, counts, sample_rows, tokens)

    def _draw(
        self, logits: torch.Tensor, states: Sequence[SamplingState], sample_rows: list[int], sample_index: list[int]
    ) -> torch.Tensor:
        device = logits.device
        penalised = [i for i, s in enumerate(states) if s.params.has_penalties]
        short = [i for i, s in enumerate(states) if s.needs_min_tokens_mask]
        x = logits.to(torch.float32, copy=True) if penalised or short else logits.float()
        apply_penalties(x, states, penalised)
        mask_stop_ids(x, states, short)

        tokens = torch.empty(len(sample_rows), dtype=torch.int64, device=device)
        greedy_pos = [p for p, r in enumerate(sample_rows) if states[r].params.is_greedy]
        if greedy_pos:
            greedy_rows = take_rows(x, [sample_rows[p] for p in greedy_pos])
            tokens[torch.tensor(greedy_pos, device=device)] = greedy_rows.argmax(dim=-1)
        random_pos = [p for p, r in enumerate(sample_rows) if not states[r].params.is_greedy]
        if random_pos:
            random_rows = sorted({sample_rows[p] for p in random_pos})
            local = {row: k for k, row in enumerate(random_rows)}
            probs = self.probabilities(x, states, random_rows)
            # uniforms[k, j] feeds draw j of random row k; unused slots stay 0.
            width = max(sample_index[p] for p in random_pos) + 1
            uniforms = self._uniforms(states, sample_rows, sample_index, random_pos, local, width, device)
            drawn = inverse_cdf(probs, uniforms)
            rows_at = torch.tensor([local[sample_rows[p]] for p in random_pos], device=device)
            cols_at = torch.tensor([sample_index[p] for p in random_pos], device=device)
            tokens[torch.tensor(random_pos, device=device)] = drawn[rows_at, cols_at]
        return tokens

    @staticmethod
    def probabilities(x: torch.Tensor, states: Sequence[SamplingState], rows: list[int]) -> torch.Tensor:
        """Temperature, then top-k, top-p and min-p for the non-greedy ``rows``: probabilities, cut ones zeroed.

        ``x`` is fp32 logits [B, V] after penalties; ``states[r]`` holds row ``r``'s params. The
        rows drawn from are exactly these distributions (speculative verification reuses them).
        """
        device, vocab = x.device, x.shape[1]
        params = [states[r].params for r in rows]
        sub = take_rows(x, rows)
        temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
        probs = (sub / temperature).softmax(dim=-1)
        # A top_k at or past the vocabulary is off; clamping here keeps huge ints out of the tensor.
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        ps = [p.top_p for p in params]
        mins = [p.min_p for p in params]
        top_k = torch.tensor(ks, device=device) if any(k < vocab for k in ks) else None
        top_p = torch.tensor(ps, dtype=torch.float32, device=device) if any(v < 1.0 for v in ps) else None
        min_p = torch.tensor(mins, dtype=torch.float32, device=device) if any(m > 0.0 for m in mins) else None
        if top_k is None and top_p is None and min_p is None:
            return probs
        threshold = keep_threshold(probs, top_k, top_p, min_p)
        return probs.masked_fill_(probs < threshold.unsqueeze(1), 0.0)  # probs is our own softmax output

    def _uniforms(
        self,
        states: Sequence[SamplingState],
        sample_rows: list[int],
        sample_index: list[int],
        positions: list[int],
        local: dict[int, int],
        width: int,
        device: torch.device,
    ) -> torch.Tensor:
        """One U[0, 1) per draw: seeded draws from their own stream, the others from the shared generator."""
        uniforms = torch.zeros((len(local), width), dtype=torch.float64, device=device)
        unseeded = [p for p in positions if states[sample_rows[p]].params.seed is None]
        if unseeded:
            values = torch.rand(
                len(unseeded), dtype=torch.float64, device=device, generator=self.shared_generator(device)
            )
            rows = torch.tensor([local[sample_rows[p]] for p in unseeded], device=device)
            cols = torch.tensor([sample_index[p] for p in unseeded], device=device)
            uniforms[rows, cols] = values
        for p in positions:
            state = states[sample_rows[p]]
            if state.params.seed is not None:
                gen = state.generator(sample_index[p], device)
                uniforms[local[sample_rows[p]], sample_index[p]] = torch.rand(
                    1, dtype=torch.float64, device=device, generator=gen
                )[0]
        return uniforms

    @staticmethod
    def _output(
        logits: torch.Tensor,
        states: Sequence[SamplingState],
        counts: list[int],
        sample_rows: list[int],
        tokens: torch.Tensor,
    ) -> SamplerOutput:
        flat = tokens.tolist()
        starts = [0]
        for k in counts:
            starts.append(starts[-1] + k)
        token_ids = [flat[starts[i] : starts[i + 1]] for i in range(len(counts))]
        logprobs: list[list[TokenLogprobs] | None] = [None] * len(counts)
        asked = [p for p, r in enumerate(sample_rows) if states[r].params.logprobs is not None]
        if asked:
            rows = [sample_rows[p] for p in asked]
            tops = [states[r].params.logprobs or 0 for r in rows]
            picked = tokens[torch.tensor(asked, device=tokens.device)]
            for row, entry in zip(rows, compute_logprobs(logits, rows, picked, tops), strict=True):
                slot = logprobs[row]
                if slot is None:
                    logprobs[row] = slot = []
                slot.append(entry)
        return SamplerOutput(token_ids, logprobs)
