"""What a core checks of a request that arrived over a socket from another process.

A front end validates every request where it enters (:class:`~paged_core.frontend.input_processor.InputProcessor`
for ``LLM``, the routes for the server); a core in the same process trusts it. A core in a child process reads
msgpack off a socket, so before it computes with a request it re-checks, cheaply, what a step would index or
size with: token ids inside the vocabulary, stop ids and ``top_k`` bounded by it, an int64 priority, a beam
width and beam params it can honour. The words are the front end's, so a refusal reads the same either way.
"""

from __future__ import annotations

import msgspec

from paged_core.engine_core.beam_params import check_beam
from paged_core.engine_core.messages import CoreRequest
from paged_core.errors import RequestRejectedError
from paged_core.sampling.params import INT64_MAX, INT64_MIN


def check_wire_request(request: CoreRequest, vocab_size: int, max_num_seqs: int) -> CoreRequest:
    """``request`` with its params bounded by the vocabulary; :class:`RequestRejectedError` naming what is wrong."""
    ids = request.prompt_token_ids
    if not ids:
        raise RequestRejectedError("prompt is empty")
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise RequestRejectedError(f"prompt: token ids must be ints in [0, {vocab_size}); got {bad[:5]!r}")
    if not INT64_MIN <= request.priority <= INT64_MAX:
        raise RequestRejectedError("priority must be an int in [-2**63, 2**63 - 1]")
    params = request.params.for_vocabulary(vocab_size)
    if request.beam is not None:
        check_beam(params, request.beam, max_num_seqs)
    return request if params is request.params else msgspec.structs.replace(request, params=params)
