"""make_client: the one place that chooses a core client, from the config and the caller.

===========================  =============================================  ==================================
caller                        core                                           client
===========================  =============================================  ==================================
``LLM`` / ``LLMEngine``        in this process (the default)                  :class:`InProcClient`
``LLM(multiprocess=True)``     a child process                                :class:`BlockingClient` over
                                                                              :class:`CoreProcess`
``paged serve``                a child process (the default)                  :class:`EventLoopClient` over
                                                                              :class:`CoreProcess`
``--engine-in-process``        a thread of the server                         :class:`EventLoopClient` over
                                                                              :class:`CoreThread`
``--data-parallel-size M``     M child processes                              :class:`DataParallelClient`
===========================  =============================================  ==================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from paged_core.clients.blocking import BlockingClient
from paged_core.clients.core_process import CoreProcess
from paged_core.clients.core_thread import CoreThread
from paged_core.clients.event_loop import EventLoopClient
from paged_core.clients.in_process import InProcClient
from paged_core.clients.interface import AsyncCoreClient, CoreClient, SyncCoreClient
from paged_core.engine_config import EngineConfig
from paged_core.errors import ConfigError

if TYPE_CHECKING:
    from paged_core.loading.build import LoadedModel


def load_frontend_tokenizer(config: EngineConfig) -> Any | None:
    """The model's tokenizer alone (a front end never loads the weights)."""
    from paged_core.loading.loader import load_tokenizer, resolve_source

    return load_tokenizer(resolve_source(config.model.model))


def start_core_process(config: EngineConfig, **process_options: Any) -> tuple[CoreProcess, Any | None]:
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


def thread_client(core: Any) -> EventLoopClient:
    """An event-loop client over ``core`` (an :class:`~paged_core.engine_core.core.EngineCore` or anything with its
    interface), stepped on a thread of this process."""
    return EventLoopClient(CoreThread(core))


@overload
def make_client(
    config: EngineConfig, *, event_loop: Literal[False], in_process: bool, loaded: LoadedModel | None = None
) -> tuple[SyncCoreClient, Any | None]: ...
@overload
def make_client(
    config: EngineConfig, *, event_loop: Literal[True], in_process: bool, loaded: LoadedModel | None = None
) -> tuple[AsyncCoreClient, Any | None]: ...
def make_client(
    config: EngineConfig, *, event_loop: bool, in_process: bool, loaded: LoadedModel | None = None
) -> tuple[CoreClient, Any | None]:
    """The client for a caller and its tokenizer; the core is running on return (see the module's table).

    ``event_loop``: the caller is the asyncio server (outputs are delivered to its loop), else a synchronous front
    end that pulls them. ``in_process``: the core runs in this process (the caller's thread, or a thread of the
    server), else in a child process. ``config.parallel.data_parallel_size`` above 1 means that many core
    processes behind one server. ``loaded`` shares already-loaded weights with an in-process core.
    """
    from paged_core.engine_core.core import EngineCore

    dp = config.parallel.data_parallel_size
    if dp > 1:
        if in_process:
            raise ConfigError(
                f"--data-parallel-size {dp} runs one engine-core process per core; it cannot be "
                "combined with --engine-in-process (one core on a thread of the server)"
            )
        if not event_loop:
            from paged_core.data_parallel import require_one_engine_core

            require_one_engine_core(config)
        from paged_core.clients.dp_client import DataParallelClient

        return DataParallelClient.launch(config)
    if not in_process and loaded is not None:
        raise ValueError("a multi-process engine loads its own model; loaded= is in-process only")
    if in_process:
        core = EngineCore(config, loaded)
        return (thread_client(core) if event_loop else InProcClient(core)), core.tokenizer
    process, tokenizer = start_core_process(config)
    return (EventLoopClient(process) if event_loop else BlockingClient(process)), tokenizer
