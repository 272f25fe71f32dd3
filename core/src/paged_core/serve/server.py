"""run_server: start the engine core (a child process by default), then serve it with uvicorn until stopped.

After SIGTERM or Ctrl-C in-flight requests get ``drain_timeout`` seconds, then end with an error event
(:class:`~paged_core.serve.drain.DrainingServer`); the core is stopped and
no process is left behind; uvicorn then re-raises the signal (SIGTERM ends the process by it, Ctrl-C exits
130). The status is 1 when the engine core died (every open stream ended with an error
naming the cause, ``/health`` answered 503 meanwhile), so a supervisor restarts the server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from paged_core.engine_config import EngineConfig
from paged_core.serve.settings import ServeConfig

if TYPE_CHECKING:
    from paged_core.serve.async_engine import AsyncEngine

log = logging.getLogger("paged.serve")

DEAD_EXIT_DELAY = 1.0
"""Seconds the server keeps answering 503 after the core died, before it exits."""


def start_engine(engine_config: EngineConfig, in_process: bool = False) -> AsyncEngine:
    """The :class:`AsyncEngine` over a core process (or, ``in_process``, a core thread); blocks until it runs.

    With ``data_parallel_size`` M > 1 it is M core processes behind a
    :class:`~paged_core.clients.dp_client.DataParallelClient` (not combinable with ``in_process``).
    """
    from paged_core.clients.factory import make_client
    from paged_core.serve.async_engine import AsyncEngine

    client, tokenizer = make_client(engine_config, event_loop=True, in_process=in_process)
    pids = [pid for pid in getattr(client, "pids", [getattr(client, "pid", None)]) if pid is not None]
    if pids:
        log.info("engine core running in process%s %s", "es" if len(pids) > 1 else "", ", ".join(map(str, pids)))
    return AsyncEngine(client, tokenizer)


def run_server(engine_config: EngineConfig, config: ServeConfig, in_process: bool = False) -> int:
    """Start the engine and the app, then block serving HTTP on ``config.host:config.port``; the exit status."""
    import uvicorn

    from paged_core.serve.app import build_app
    from paged_core.serve.drain import DrainingServer
    from paged_core.serve.timeouts import uvicorn_options

    engine = start_engine(engine_config, in_process)
    try:
        app = build_app(engine, config)
        timeouts = uvicorn_options(config.idle_timeout, config.header_timeout, config.body_timeout)
        uconfig = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level, **timeouts)
        server = DrainingServer(uconfig, engine, config.drain_timeout)
        died: list[str] = []

        def on_dead(why: str) -> None:
            died.append(why)
            log.error("engine core died (%s); the server exits in %.0f s", why, DEAD_EXIT_DELAY)
            asyncio.get_running_loop().call_later(DEAD_EXIT_DELAY, setattr, server, "should_exit", True)

        app.state.paged.engine.on_dead = on_dead
        auth = "bearer-token auth on" if config.api_key else "no auth"
        dp = engine_config.parallel.data_parallel_size
        mode = "in-process engine" if in_process else f"{dp} engine-core processes" if dp > 1 else "engine-core process"
        log.info(
            "serving %s on http://%s:%d (%s, %s)", app.state.paged.model_name, config.host, config.port, auth, mode
        )
        try:
            server.run()
        except SystemExit:
            if server.started:
                raise
            # uvicorn exits (status 3) when the app's start-up failed; the reason is told below instead
    finally:
        engine.stop()  # idempotent; the app's lifespan normally did it
    if not server.started:  # the app did not start (a --lora-modules adapter that did not load, say: logged)
        log.error("the server did not start")
        return 1
    return 1 if died else 0
