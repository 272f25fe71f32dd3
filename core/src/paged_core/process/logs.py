"""Logging set-up for CLI commands: quiet by default, engine details with ``-v``."""

from __future__ import annotations

import logging
import os
import warnings


def setup_logging(verbose: bool) -> None:
    """Show paged's own INFO logs when verbose; keep transformers' progress bars and warnings out of the way."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:  # transformers is a dependency; this only guards odd installs
        pass
    if not verbose:
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
