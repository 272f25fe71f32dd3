"""EngineConfig: every knob of one engine, as six validated sections.

Users mostly write it flat: ``EngineConfig.of(model="m.gguf", max_num_seqs=8)``
and ``config.replace(block_size=32)`` take the sections' field names, which are
unique across sections (checked at import), and route each to its section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from paged_core.config import (
    CacheConfig,
    GraphConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from paged_core.errors import ConfigError

__all__ = ["EngineConfig", "FlatField", "flat_fields"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """What to load and how to run it.

    ``model.model`` is a local directory (safetensors + tokenizer), a ``.gguf``
    file, or ``None`` for the embedded default (SmolLM2-135M-Instruct). The
    engine resolves what is left ``None`` (block size, number of blocks,
    ``max_model_len``) when it is built; see :mod:`paged_core.loading.build`.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, **flat: Any) -> EngineConfig:
        """A config from flat field names (``max_num_seqs=8``, ``block_size=32``...); unknown names are refused."""
        return cls(**{section: _SECTIONS[section](**values) for section, values in _split(flat).items()})

    def replace(self, **flat: Any) -> EngineConfig:
        """A copy with the named flat fields changed (validated again); unknown names are refused."""
        changed = {s: dataclasses.replace(getattr(self, s), **values) for s, values in _split(flat).items()}
        return dataclasses.replace(self, **changed)

    def to_flat(self) -> dict[str, Any]:
        """Every field by its flat name: ``EngineConfig.of(**c.to_flat()) == c``."""
        return {name: getattr(getattr(self, section), name) for name, section in _FLAT.items()}


@dataclass(frozen=True, slots=True)
class FlatField:
    """One leaf of :class:`EngineConfig`: its section, its dataclass field and its resolved type."""

    section: str
    field: dataclasses.Field[Any]
    type: Any


def flat_fields() -> dict[str, FlatField]:
    """Flat name -> that leaf, in declaration order (what the CLI generates its flags from)."""
    out = {}
    for section, cls in _SECTIONS.items():
        hints = get_type_hints(cls)
        out.update({f.name: FlatField(section, f, hints[f.name]) for f in fields(cls)})
    return out


def _split(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    unknown = sorted(set(flat) - _FLAT.keys())
    if unknown:
        raise ConfigError(f"unknown engine option(s) {', '.join(unknown)}; allowed: {', '.join(_FLAT)}")
    by_section: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        by_section.setdefault(_FLAT[name], {})[name] = value
    return by_section


def _sections() -> dict[str, type]:
    hints = get_type_hints(EngineConfig)
    return {f.name: hints[f.name] for f in fields(EngineConfig)}


def _flat_names(sections: dict[str, type]) -> dict[str, str]:
    owner: dict[str, str] = {}
    for section, cls in sections.items():
        for f in fields(cls):
            if f.name in owner:  # a programming error: flat names must stay unambiguous
                raise TypeError(f"field {f.name!r} is declared in both {owner[f.name]} and {section}")
            owner[f.name] = section
    return owner


_SECTIONS = _sections()
_FLAT = _flat_names(_SECTIONS)
"""Flat field name -> the section that holds it."""
