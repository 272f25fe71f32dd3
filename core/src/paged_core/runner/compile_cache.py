"""The on-disk cache of compiled steps: torch's own inductor caches, in a folder keyed by what was compiled.

The folder is ``<root>/<key>`` where the key hashes the model (its config and
weight file), dtype, backend (name and package version), device type, graph
mode, and the torch and paged-core versions: a different one never reuses
another's artifacts. A manifest written after a successful compile records
those fields and a checksum of every file; at the next start a manifest that
is missing, unreadable, for another key or whose files changed means the
folder is wiped and rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("paged.engine")

MANIFEST = "paged-compile-cache.json"
DEFAULT_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "paged" / "compile"


def _digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def _checksums(folder: Path) -> dict[str, str]:
    sums = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        sums[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return sums


class CompileCache:
    """One configuration's cache folder; :meth:`activate` before compiling, :meth:`seal` after."""

    def __init__(self, fields: dict[str, Any], root: str | Path | None = None) -> None:
        self.fields = dict(fields)
        self.key = _digest(self.fields)
        self.folder = Path(root if root is not None else DEFAULT_ROOT) / self.key
        self.hit = False

    def validate(self) -> bool:
        """Whether the folder holds a sealed, intact cache for exactly these fields (else it is wiped)."""
        manifest = self.folder / MANIFEST
        if not self.folder.exists():
            return False
        try:
            data = json.loads(manifest.read_text())
            ok = bool(data["fields"] == self.fields and data["files"] == _checksums(self.folder))
            why = "it was built for another configuration or its files changed"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ok, why = False, f"its manifest is missing or unreadable ({type(exc).__name__})"
        if not ok:
            log.warning("compile cache %s is not usable (%s); rebuilding it", self.folder, why)
            shutil.rmtree(self.folder, ignore_errors=True)
        return ok

    def activate(self) -> None:
        """Point torch's inductor caches at this folder (checked first)."""
        self.hit = self.validate()
        self.folder.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.folder / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(self.folder / "triton")
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = True
        log.info("compile cache %s (%s)", self.folder, "hit" if self.hit else "cold")

    def seal(self) -> None:
        """Record the fields and every file's checksum, once the compile succeeded."""
        manifest = {"fields": self.fields, "files": _checksums(self.folder)}
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
