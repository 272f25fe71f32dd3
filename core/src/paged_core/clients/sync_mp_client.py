"""SyncMPClient: the :class:`~paged_core.clients.sync_client.CoreClient` contract over a core in a child process."""

from __future__ import annotations

import collections
import itertools
from typing import Any

from paged_core.clients.core_process import CoreProcess
from paged_core.engine_config import EngineConfig
from paged_core.engine_core.messages import (
    CoreAbort,
    CoreAdmission,
    CoreOutputs,
    CoreRequest,
    CoreRequests,
    CoreUtility,
    CoreUtilityResult,
    FromCore,
)
from paged_core.errors import EngineDeadError, RequestRejectedError


def load_frontend_tokenizer(config: EngineConfig) -> Any | None:
    """The model's tokenizer alone (a front end never loads the weights)."""
    from paged_core.loading.loader import load_tokenizer, resolve_source

    return load_tokenizer(resolve_source(config.model.model))


def start_with_tokenizer(config: EngineConfig, **process_options: Any) -> tuple[CoreProcess, Any | None]:
    """Start a core process and load the tokenizer while it loads the model; both ready on return.

    A model path that does not resolve is refused before any process starts.
    """
    from paged_core.loading.loader import resolve_source

    resolve_source(config.model.model)
    process = CoreProcess(config, **process_options)
    try:
        tokenizer = load_frontend_tokenizer(config)
        process.wait_ready()
    except BaseException:
        process.close(timeout=2.0)
        raise
    return process, tokenizer


class SyncMPClient:
    """Blocking calls to a core process: :meth:`add` waits for the core's admission, :meth:`step` for its next step.

    Messages that arrive while waiting for something else are kept in order, so no output is lost.
    """

    def __init__(self, process: CoreProcess) -> None:
        self.process = process
        self.facts = process.wait_ready()
        self._outputs: collections.deque[CoreOutputs] = collections.deque()
        self._admitted: dict[str, str | None] = {}
        self._results: dict[int, CoreUtilityResult] = {}
        self._calls = itertools.count()

    def _pump(self) -> None:
        """Wait for one message and file it."""
        msg: FromCore | None = None
        while msg is None:
            msg = self.process.recv(100)
        if isinstance(msg, CoreOutputs):
            self._outputs.append(msg)
        elif isinstance(msg, CoreAdmission):
            self._admitted.update(dict.fromkeys(msg.accepted))
            self._admitted.update(msg.rejected)
        elif isinstance(msg, CoreUtilityResult):
            self._results[msg.call_id] = msg

    def add(self, request: CoreRequest) -> None:
        self.process.send(request)
        rid = request.request_id
        while rid not in self._admitted:
            self._pump()
        error = self._admitted.pop(rid)
        if error is not None:
            raise RequestRejectedError(error)

    def add_many(self, requests: list[CoreRequest]) -> dict[str, str]:
        self.process.send(CoreRequests(requests))
        ids = [r.request_id for r in requests]
        while not all(rid in self._admitted for rid in ids):
            self._pump()
        answers = {rid: self._admitted.pop(rid) for rid in ids}
        return {rid: why for rid, why in answers.items() if why is not None}

    def abort(self, abort: CoreAbort) -> None:
        self.process.send(abort)

    def step(self) -> CoreOutputs:
        while not self._outputs:
            self._pump()
        return self._outputs.popleft()

    def call(self, method: str) -> Any:
        call_id = next(self._calls)
        self.process.send(CoreUtility(call_id, method))
        while call_id not in self._results:
            self._pump()
        result = self._results.pop(call_id)
        if result.error is not None:
            raise EngineDeadError(result.error) if not self.process.alive else RuntimeError(result.error)
        return result.result

    def shutdown(self) -> None:
        self.process.close()
