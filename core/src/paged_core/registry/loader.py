"""Load one plugin in isolation: import it, validate its hooks with pluggy, call its hook."""

from __future__ import annotations

import pluggy

from paged_core.contract.backend import AttentionBackend
from paged_core.registry import hookspecs
from paged_core.registry.classify import classify
from paged_core.registry.record import BackendRecord, BackendStatus, describe_exception, one_line
from paged_core.registry.source import PluginSource

HOOK_NAME = "paged_register_backends"


def new_plugin_manager() -> pluggy.PluginManager:
    """A PluginManager that knows paged-core's hook specifications."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _unique_name(pm: pluggy.PluginManager, wanted: str) -> str:
    # Two distributions may both call their entry point "cuda"; pluggy needs distinct names.
    name, n = wanted, 1
    while pm.has_plugin(name):
        n += 1
        name = f"{wanted}#{n}"
    return name


def _unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    callers = pm.get_hookcallers(plugin) or []
    return sorted(c.name for c in callers if not c.has_spec())


def _as_backend_classes(result: object) -> list[type[AttentionBackend]] | None:
    """The result as a de-duplicated list of backend classes, or ``None`` if it is anything else."""
    if not isinstance(result, list | tuple):
        return None
    out: list[type[AttentionBackend]] = []
    for item in result:
        if not (isinstance(item, type) and issubclass(item, AttentionBackend)):
            return None
        if item not in out:
            out.append(item)
    return out


def _describe_junk(result: object) -> str:
    if isinstance(result, list | tuple):
        bad = next(i for i in result if not (isinstance(i, type) and issubclass(i, AttentionBackend)))
        got = f"a {type(result).__name__} containing {one_line(repr(bad), 80)}"
    else:
        got = type(result).__name__
    return f"{HOOK_NAME}() returned {got}; expected a list of AttentionBackend subclasses"


def load_source(pm: pluggy.PluginManager, source: PluginSource) -> list[BackendRecord]:
    """Load ``source`` and classify each backend it provides; never raises for a broken plugin.

    A plugin-level failure yields one record named after the entry point.
    """

    def failed(reason: str) -> list[BackendRecord]:
        return [source.record(source.name, BackendStatus.LOAD_ERROR, reason)]

    try:
        plugin = source.load()
    except (Exception, SystemExit) as exc:  # a plugin calling sys.exit() at import must not end the process
        return failed(f"import of {source.value!r} failed: {describe_exception(exc)}")

    if plugin is None:  # pluggy silently ignores None, which would hide the mistake
        return failed(f"{source.value!r} loaded None instead of a plugin")
    # A module reached twice (a built-in also declared as an entry point) keeps its first registration;
    # its backends then come out as the same classes, which the duplicate check folds into one.
    reg_name = pm.get_name(plugin) if pm.is_registered(plugin) else None
    if reg_name is None:
        reg_name = _unique_name(pm, source.name)
        try:
            pm.register(plugin, name=reg_name)
        except pluggy.PluginValidationError as exc:
            return failed(f"invalid hook implementation: {describe_exception(exc)}")

    impls = [i for i in pm.hook.paged_register_backends.get_hookimpls() if i.plugin_name == reg_name]
    if not impls:
        unknown = _unknown_hooks(pm, plugin) if pm.is_registered(plugin) else []
        hint = f" (it implements unknown hooks: {', '.join(unknown)})" if unknown else ""
        return failed(f"{source.value!r} has no @hookimpl {HOOK_NAME}{hint}")

    try:
        result = impls[0].function()
    except (Exception, SystemExit) as exc:  # one raising (or exiting) plugin only breaks itself
        return failed(f"{HOOK_NAME}() raised {describe_exception(exc)}")
    classes = _as_backend_classes(result)
    if classes is None:
        return failed(_describe_junk(result))
    if not classes:
        return [source.record(source.name, BackendStatus.UNAVAILABLE, f"{HOOK_NAME}() returned no backends")]
    return [classify(source, cls) for cls in classes]
