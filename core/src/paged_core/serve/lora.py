"""The LoRA adapters a server serves: names to :class:`LoRARequest`, ids, runtime loads and unloads.

A request's ``model`` names the base model (its served name) or one adapter. The server gives ids itself, 1, 2,
... in load order, and never reuses one: an id keys the prefix cache, so an adapter loaded again under an old name
(new weights, maybe) must not hit the blocks of the one before it. A name keeps its id while it is loaded.

Unloading takes the name away at once (new requests get 404); the core forgets the adapter when the last request
running on it has ended (each :class:`~paged_core.serve.generation.Generation` holds its adapter from start to
close), so an unload never pulls weights from under a running request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from paged_core.errors import ConfigError, EngineDeadError
from paged_core.lora.request import LoRARequest
from paged_core.serve.errors import APIError
from paged_core.serve.lora_modules import LoRAModule

if TYPE_CHECKING:
    from paged_core.serve.async_engine import AsyncEngine

log = logging.getLogger("paged.serve")

SHOWN_NAMES = 8
"""Served names listed in an unknown model's 404 (the rest are counted)."""


class LoRARegistry:
    """The adapters served beside the base model ``base_name``, over ``engine``."""

    def __init__(self, engine: AsyncEngine, base_name: str) -> None:
        self.engine = engine
        self.base_name = base_name
        self.adapters: dict[str, LoRARequest] = {}
        """Served adapters by name, in load order."""
        self._next_id = 1
        self._loading: set[str] = set()
        self._users: Counter[int] = Counter()
        self._unloaded: dict[int, LoRARequest] = {}
        """Adapters whose name is gone, still in the core until their last request ends."""
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- which model a request names -----------------------------------------
    def resolve(self, name: str) -> LoRARequest | None:
        """The adapter ``name`` names, None for the base model; a 404 (OpenAI's ``model_not_found``) otherwise."""
        if name == self.base_name:
            return None
        lora = self.adapters.get(name)
        if lora is None:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves {self._served()}",
                param="model",
                code="model_not_found",
            )
        return lora

    def _served(self) -> str:
        names = [self.base_name, *self.adapters]
        shown = ", ".join(f"'{n}'" for n in names[:SHOWN_NAMES])
        more = len(names) - SHOWN_NAMES
        return shown + (f" and {more} more (GET /v1/models lists them)" if more > 0 else "")

    # ---- requests running on an adapter ---------------------------------------
    def acquire(self, lora: LoRARequest) -> None:
        """Count a generation running on ``lora``; a 404 if it was unloaded since the route resolved it."""
        if self.adapters.get(lora.name) is not lora:
            raise APIError(
                404,
                f"the model '{lora.name}' does not exist; it was unloaded while the request was prepared",
                param="model",
                code="model_not_found",
            )
        self._users[lora.id] += 1

    def release(self, lora: LoRARequest) -> None:
        """The generation on ``lora`` ended; the core forgets an unloaded adapter once nothing runs on it."""
        self._users[lora.id] -= 1
        if self._users[lora.id] > 0:
            return
        del self._users[lora.id]
        if self._unloaded.pop(lora.id, None) is not None:
            task = asyncio.get_running_loop().create_task(self._remove(lora))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def in_use(self, lora: LoRARequest) -> int:
        """Generations running on ``lora`` now."""
        return self._users.get(lora.id, 0)

    # ---- loading and unloading -------------------------------------------------
    async def load(self, name: str, path: str) -> LoRARequest:
        """Load and check the adapter at ``path`` in the core, then serve it as ``name``; a 400 names the problem
        (the name taken, or what is wrong with the adapter), a 503 a dead engine."""
        if name == self.base_name:
            raise APIError(
                400, f"'{name}' is the base model's served name; give the adapter another name", param="lora_name"
            )
        if name in self.adapters or name in self._loading:
            raise APIError(400, f"the LoRA adapter '{name}' is already loaded", param="lora_name")
        lora = LoRARequest(name, self._next_id, path)
        self._next_id += 1
        self._loading.add(name)
        try:
            problem = await self.engine.load_lora(lora)
        except EngineDeadError as exc:
            raise APIError(503, str(exc)) from None
        finally:
            self._loading.discard(name)
        if problem is not None:
            raise APIError(400, problem, param="lora_path")
        self.adapters[name] = lora
        log.info("LoRA adapter '%s' (id %d) loaded from %s", name, lora.id, path)
        return lora

    async def load_modules(self, modules: Iterable[LoRAModule]) -> None:
        """Load the server's ``--lora-modules`` at start-up; the first that fails raises :class:`ConfigError`."""
        for module in modules:
            if module.base_model_name is not None and module.base_model_name != self.base_name:
                log.warning(
                    "LoRA module '%s' names base model '%s'; this server serves '%s' (the name is not used)",
                    module.name,
                    module.base_model_name,
                    self.base_name,
                )
            try:
                await self.load(module.name, module.path)
            except APIError as exc:
                raise ConfigError(f"--lora-modules {module.name}: {exc.message}") from None

    async def unload(self, name: str) -> LoRARequest:
        """Stop serving ``name`` (404 if it is not an adapter served here); the core forgets it now, or when the
        last request running on it ends."""
        lora = self.adapters.pop(name, None)
        if lora is None:
            raise APIError(404, f"the LoRA adapter '{name}' is not loaded", param="lora_name", code="model_not_found")
        if self.in_use(lora):
            self._unloaded[lora.id] = lora
            log.info(
                "LoRA adapter '%s' unloaded; the engine forgets it when its %d request(s) end", name, self.in_use(lora)
            )
        else:
            await self._remove(lora)
            log.info("LoRA adapter '%s' unloaded", name)
        return lora

    async def _remove(self, lora: LoRARequest) -> None:
        try:
            await self.engine.remove_lora(lora.id)
        except Exception as exc:  # the name is gone either way; a core that cannot forget it only keeps memory
            log.error("the engine did not forget LoRA adapter '%s' (id %d): %s", lora.name, lora.id, exc)
