"""Name clashes: the same backend name from two sources makes both unusable, unless one is built in."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from paged_core.registry.filters import ENV_DENY
from paged_core.registry.record import BackendRecord, BackendStatus


def _competes(record: BackendRecord) -> bool:
    # Plugin-level failures carry the entry-point name, not a backend name; disabled ones stepped aside.
    return record.backend_cls is not None and record.status is not BackendStatus.DISABLED


def mark_duplicates(records: list[BackendRecord]) -> list[BackendRecord]:
    """Return ``records`` with every name clash resolved, order kept.

    The same class reached twice (a built-in also declared as an entry
    point) is one backend: later copies are dropped. Different classes with
    one name are all marked DUPLICATE, because picking one silently would
    depend on install order; a core built-in is the exception and keeps its
    status while the third-party ones are marked.
    """
    seen: set[type] = set()
    kept: list[BackendRecord] = []
    for rec in records:
        if _competes(rec) and rec.backend_cls in seen:
            continue
        if rec.backend_cls is not None:
            seen.add(rec.backend_cls)
        kept.append(rec)

    groups: dict[str, list[int]] = defaultdict(list)
    for i, rec in enumerate(kept):
        if _competes(rec):
            groups[rec.name].append(i)
    for name, idx in groups.items():
        if len(idx) < 2:
            continue
        clash = [kept[i] for i in idx]
        builtins = [r for r in clash if r.builtin]
        for i in idx:
            rec = kept[i]
            if len(builtins) == 1:
                if rec.builtin:
                    continue
                reason = f"name {name!r} is taken by the built-in backend of {builtins[0].source}; ignored"
            else:
                others = "; ".join(r.source for r in clash)
                reason = (
                    f"name {name!r} is provided by several sources: {others}; "
                    f"remove or deny one with {ENV_DENY}=<distribution or entry-point name>"
                )
            kept[i] = dataclasses.replace(rec, status=BackendStatus.DUPLICATE, reason=reason)
    return kept
