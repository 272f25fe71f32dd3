"""Anthropic's Messages API on the server: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The body is converted to a chat completion request (:mod:`.convert`) and runs through the chat route's own
checks, template and :class:`~paged_core.serve.generation.Generation`; only the wire differs: the body
(:mod:`.protocol`), the answer and its event stream (:mod:`.stream`), and the error shape (:mod:`.errors`).
"""

from paged_core.serve.anthropic.routes import router

__all__ = ["router"]
