"""Per-sequence sampling state: random streams, output counts and the stop ids min_tokens masks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch

from paged_core.sampling.params import SamplingParams


def stream_seed(seed: int, index: int) -> int:
    """The generator seed of sample ``index`` of a request seeded with ``seed``.

    Hashing (rather than ``seed + index``) keeps requests with nearby seeds from
    sharing streams, and is stable across processes and platforms.
    """
    digest = hashlib.sha256(f"paged-sampling/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class SamplingState:
    """What the sampler needs to know about one sequence between steps.

    The engine builds one per request, ``SamplingState(params, prompt_token_ids,
    index=0, eos_token_ids=...)``, and calls :meth:`append` for each accepted
    output token (the sampler never mutates a state's tokens itself).

    Random streams: with ``params.seed`` set, sample ``j`` of a request draws
    from its own ``torch.Generator`` seeded by :func:`stream_seed` from
    ``(seed, j)``, so a request's tokens do not depend on its batch neighbours
    and its ``n`` samples differ. When a row is sampled ``k`` times at once
    (``num_samples`` in :meth:`Sampler.sample`, used for the shared prefill of
    an ``n > 1`` request), the draws use streams ``index, index + 1, ...,
    index + k - 1``; :meth:`fork` then hands stream ``j`` to the child sequence
    ``j``, so each child continues exactly where its first draw left off.
    """

    __slots__ = (
        "_counts",
        "_device",
        "_generators",
        "_prompt_ids",
        "_prompt_unique",
        "_stop_ids",
        "_stop_list",
        "eos_token_ids",
        "index",
        "output_token_ids",
        "params",
    )

    def __init__(
        self,
        params: SamplingParams,
        prompt_token_ids: Sequence[int],
        index: int = 0,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"index must be an int >= 0, got {index!r}")
        self.params = params
        self.index = index
        self.eos_token_ids = tuple(eos_token_ids)
        self.output_token_ids: list[int] = []
        self._prompt_ids = prompt_token_ids
        self._counts: dict[int, int] = {}
        self._generators: dict[int, torch.Generator] = {}
        self._device: torch.device | None = None
        self._prompt_unique: torch.Tensor | None = None
        self._stop_ids: torch.Tensor | None = None
        eos = () if params.ignore_eos else self.eos_token_ids
        self._stop_list = tuple(dict.fromkeys((*eos, *(params.stop_token_ids or ()))))

    def append(self, token_id: int) -> None:
        """Record an accepted output token (feeds penalties and ``min_tokens``)."""
        self.output_token_ids.append(token_id)
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def fork(self, index: int) -> SamplingState:
        """A child sequence that continues stream ``index`` of this one.

        The child copies the outputs so far and takes over this state's
        generator for ``index`` (if it was used), so it must not be sampled
        under that index here again.
        """
        child = SamplingState(self.params, self._prompt_ids, index, self.eos_token_ids)
        child.output_token_ids = list(self.output_token_ids)
        child._counts = dict(self._counts)
        child._prompt_unique = self._prompt_unique
        child._stop_ids = self._stop_ids
        generator = self._generators.pop(index, None)
        if generator is not None:
            child._generators[index] = generator
            child._device = self._device
        return child

    @property
    def num_output_tokens(self) -> int:
        """Output tokens accepted so far."""
        return len(self.output_token_ids)

    @property
    def output_counts(self) -> dict[int, int]:
        """Occurrences of each output token id (read-only view by convention)."""
        return self._counts

    @property
    def needs_min_tokens_mask(self) -> bool:
        """True while end-of-sequence ids must be masked to honour ``min_tokens``."""
        return len(self.output_token_ids) < self.params.min_tokens and bool(self._stop_list)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that would end the sequence: stop ids, plus EOS unless ``ignore_eos``."""
        return self._stop_list

    def generator(self, sample: int, device: torch.device) -> torch.Generator:
        """The seeded generator of stream ``index + sample`` on ``device`` (made on first use)."""
        seed = self.params.seed
        if seed is None:
            raise ValueError("generator() needs params.seed; unseeded rows use the sampler's shared generator")
        if self._device is not None and self._device != device:
            raise ValueError(f"seeded state was first sampled on {self._device}, now asked on {device}")
        self._device = device
        stream = self.index + sample
        gen = self._generators.get(stream)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(stream_seed(seed, stream))
            self._generators[stream] = gen
        return gen

    def prompt_unique_ids(self, device: torch.device) -> torch.Tensor:
        """Distinct prompt token ids as an int64 tensor (built once, for the repetition penalty)."""
        if self._prompt_unique is None or self._prompt_unique.device != device:
            ids = sorted(set(self._prompt_ids))
            self._prompt_unique = torch.tensor(ids, dtype=torch.int64, device=device)
        return self._prompt_unique

    def stop_ids_tensor(self, device: torch.device) -> torch.Tensor:
        """:attr:`stop_ids` as an int64 tensor (built once)."""
        if self._stop_ids is None or self._stop_ids.device != device:
            self._stop_ids = torch.tensor(self._stop_list, dtype=torch.int64, device=device)
        return self._stop_ids
