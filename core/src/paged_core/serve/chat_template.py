"""``--chat-template``: the text of a chat template given as a bundled name, a file, or the template itself.

Bundled templates live in ``paged_core/serve/chat_templates/`` (``chatml-tools``: ChatML that offers tools and
renders calls and results the way the ``hermes`` parser reads them).
"""

from __future__ import annotations

from pathlib import Path

from paged_core.errors import ConfigError

BUNDLED_DIR = Path(__file__).with_name("chat_templates")


def bundled_templates() -> list[str]:
    """Names of the templates shipped with paged."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.jinja"))


def chat_template_text(value: str) -> str:
    """The template ``value`` names: a bundled one, a file, or (when it holds Jinja tags) the text itself."""
    bundled = BUNDLED_DIR / f"{value}.jinja"
    if "/" not in value and bundled.is_file():
        return bundled.read_text(encoding="utf-8")
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{{" in value or "{%" in value:
        return value
    raise ConfigError(
        f"--chat-template {value!r} is neither a file, a Jinja template nor a bundled template "
        f"({', '.join(bundled_templates())})"
    )
