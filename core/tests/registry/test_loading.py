"""Loading plugins: good ones load, and each kind of broken plugin breaks only itself."""

from __future__ import annotations

import sys

import pytest

from paged_core.api import hookimpl
from paged_core.registry import BackendStatus


def test_good_plugin_loads_with_provenance(plugins, make_backend) -> None:
    alpha = make_backend("alpha", priority=7, device="cpu")
    plugins.provides("fake_good", alpha)
    plugins.dist("paged-backend-alpha", "2.3", alpha_ep="fake_good")
    [rec] = plugins.registry().records()
    assert rec.name == "alpha"
    assert rec.status is BackendStatus.LOADED
    assert (rec.distribution, rec.distribution_version, rec.entry_point) == ("paged-backend-alpha", "2.3", "alpha_ep")
    assert (rec.priority, rec.device, rec.backend_cls, rec.reason) == (7, "cpu", alpha, "")
    assert rec.capabilities is not None and rec.capabilities.block_sizes == (16, 32)
    assert rec.builtin is False


def test_plugin_is_registered_with_pluggy_under_its_entry_point_name(plugins, make_backend) -> None:
    module = plugins.provides("fake_reg", make_backend("alpha"))
    plugins.dist("dist-a", alpha_ep="fake_reg")
    registry = plugins.registry()
    assert registry.plugin_manager.get_plugin("alpha_ep") is module


def test_object_entry_point_with_attribute(plugins, make_backend) -> None:
    beta = make_backend("beta")

    class Plugin:
        @hookimpl
        def paged_register_backends(self):
            return [beta]

    plugins.module("fake_obj", plugin=Plugin())
    plugins.dist("dist-b", beta="fake_obj:plugin")
    assert plugins.registry().get("beta") is beta


def test_import_failure_is_one_line_and_others_still_load(plugins, make_backend) -> None:
    plugins.provides("fake_fine", make_backend("fine"))
    plugins.dist("dist-broken", broken="fake_does_not_exist.plugin")
    plugins.dist("dist-fine", fine="fake_fine")
    records = {r.name: r for r in plugins.registry().records()}
    assert records["fine"].status is BackendStatus.LOADED
    broken = records["broken"]
    assert broken.status is BackendStatus.LOAD_ERROR
    assert broken.distribution == "dist-broken"
    assert "ModuleNotFoundError" in broken.reason and "fake_does_not_exist" in broken.reason
    assert "\n" not in broken.reason


def test_plugin_exiting_at_import_does_not_end_the_process(plugins, monkeypatch) -> None:
    class ExitingFinder:
        """Makes importing ``fake_exits`` call sys.exit, like a badly written plugin."""

        def find_spec(self, name, path=None, target=None):
            if name == "fake_exits":
                raise SystemExit(3)
            return None

    monkeypatch.setattr(sys, "meta_path", [ExitingFinder(), *sys.meta_path])
    plugins.dist("dist-exit", exits="fake_exits")
    [rec] = plugins.registry().records()
    assert rec.status is BackendStatus.LOAD_ERROR
    assert "SystemExit: 3" in rec.reason


def test_wrong_hookimpl_argument_name_is_a_load_error(plugins, make_backend) -> None:
    def paged_register_backends(config):
        return [make_backend("never")]

    plugins.hook("fake_wrong_arg", paged_register_backends)
    plugins.provides("fake_ok", make_backend("ok"))
    plugins.dist("dist-wrong", wrong="fake_wrong_arg", ok="fake_ok")
    registry = plugins.registry()
    records = {r.name: r for r in registry.records()}
    assert records["ok"].status is BackendStatus.LOADED
    assert records["wrong"].status is BackendStatus.LOAD_ERROR
    assert "PluginValidationError" in records["wrong"].reason and "config" in records["wrong"].reason
    assert "never" not in records
    assert not registry.plugin_manager.has_plugin("wrong")


@pytest.mark.parametrize("message", ["driver missing\nsecond line of detail", "\n  driver missing\nmore"])
def test_hook_raising_reports_type_and_first_line(plugins, make_backend, message) -> None:
    def boom():
        raise RuntimeError(message)

    plugins.hook("fake_raises", boom)
    plugins.provides("fake_ok2", make_backend("ok"))
    plugins.dist("dist-r", raises="fake_raises", ok="fake_ok2")
    records = {r.name: r for r in plugins.registry().records()}
    assert records["raises"].status is BackendStatus.LOAD_ERROR
    assert records["raises"].reason == "paged_register_backends() raised RuntimeError: driver missing"
    assert records["ok"].status is BackendStatus.LOADED


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (None, "returned NoneType"),
        ("alpha", "returned str"),
        ([object], "containing <class 'object'>"),
        ([42], "containing 42"),
    ],
)
def test_hook_returning_junk_is_a_load_error(plugins, result, expected) -> None:
    plugins.hook("fake_junk", lambda: result)
    plugins.dist("dist-junk", junk="fake_junk")
    [rec] = plugins.registry().records()
    assert rec.status is BackendStatus.LOAD_ERROR
    assert expected in rec.reason
    assert "expected a list of AttentionBackend subclasses" in rec.reason


def test_instance_instead_of_class_is_junk(plugins, make_backend) -> None:
    cls = make_backend("inst")
    plugins.hook("fake_instance", lambda: [cls()])
    plugins.dist("dist-inst", inst_ep="fake_instance")
    [rec] = plugins.registry().records()
    assert rec.status is BackendStatus.LOAD_ERROR and rec.name == "inst_ep"


def test_module_without_hookimpl_names_the_misspelled_hook(plugins, make_backend) -> None:
    plugins.module("fake_typo", paged_register_backend=hookimpl(lambda: [make_backend("t")]))
    plugins.module("fake_plain", paged_register_backends=lambda: [])  # not marked with @hookimpl
    plugins.dist("dist-t", typo="fake_typo", plain="fake_plain")
    records = {r.name: r for r in plugins.registry().records()}
    assert records["typo"].status is BackendStatus.LOAD_ERROR
    assert "unknown hooks: paged_register_backend" in records["typo"].reason
    assert records["plain"].status is BackendStatus.LOAD_ERROR
    assert "no @hookimpl paged_register_backends" in records["plain"].reason


def test_plugin_returning_no_backends_is_listed(plugins) -> None:
    plugins.hook("fake_empty", lambda: [])
    plugins.dist("dist-empty", empty="fake_empty")
    [rec] = plugins.registry().records()
    assert rec.status is BackendStatus.UNAVAILABLE
    assert "returned no backends" in rec.reason


def test_two_entry_points_with_the_same_name_both_load(plugins, make_backend) -> None:
    plugins.provides("fake_x1", make_backend("x1"))
    plugins.provides("fake_x2", make_backend("x2"))
    plugins.dist("dist-one", cuda="fake_x1")
    plugins.dist("dist-two", cuda="fake_x2")
    registry = plugins.registry()
    assert {r.name: r.status for r in registry.records()} == {"x1": BackendStatus.LOADED, "x2": BackendStatus.LOADED}


def test_builtin_import_failure_is_a_load_error(plugins) -> None:
    [rec] = plugins.registry(builtins={"reference": "fake_missing_builtin.plugin"}).records()
    assert rec.status is BackendStatus.LOAD_ERROR
    assert (rec.name, rec.distribution, rec.builtin, rec.entry_point) == ("reference", "paged-core", True, None)


def test_entry_point_resolving_to_none(plugins) -> None:
    plugins.module("fake_none_attr", plugin=None)
    plugins.dist("dist-none", nothing="fake_none_attr:plugin")
    [rec] = plugins.registry().records()
    assert rec.status is BackendStatus.LOAD_ERROR and "loaded None" in rec.reason
