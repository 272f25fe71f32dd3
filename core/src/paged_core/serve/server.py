"""run_server: load the engine, then serve it with uvicorn until interrupted."""

from __future__ import annotations

import logging

from paged_core.engine.config import EngineConfig
from paged_core.serve.config import ServeConfig

log = logging.getLogger("paged.serve")


def run_server(engine_config: EngineConfig, config: ServeConfig) -> None:
    """Build the engine and the app, then block serving HTTP on ``config.host:config.port``."""
    import uvicorn

    from paged_core.engine.engine import LLMEngine
    from paged_core.serve.app import build_app
    from paged_core.serve.timeouts import uvicorn_options

    engine = LLMEngine(engine_config)
    app = build_app(engine, config)
    auth = "bearer-token auth on" if config.api_key else "no auth"
    log.info("serving %s on http://%s:%d (%s)", app.state.paged.model_name, config.host, config.port, auth)
    timeouts = uvicorn_options(config.idle_timeout, config.header_timeout, config.body_timeout)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, timeout_graceful_shutdown=5,
                **timeouts)  # fmt: skip
