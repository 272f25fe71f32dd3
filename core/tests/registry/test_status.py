"""Status rules for one backend class: availability, capabilities, API version, completeness."""

from __future__ import annotations

import json

import pytest

from paged_core.api import AttentionBackend, hookimpl
from paged_core.contract.version import PLUGIN_API_VERSION
from paged_core.registry import BackendStatus


@pytest.fixture
def load_one(plugins):
    """Load a single backend class through a one-plugin distribution and return its record."""

    def load(cls: type[AttentionBackend]):
        plugins.module("fake_single", paged_register_backends=hookimpl(lambda: [cls]))
        plugins.dist("dist-single", single="fake_single")
        [rec] = plugins.registry().records()
        return rec

    return load


def test_unavailable_keeps_reason_device_and_capabilities(load_one, make_backend) -> None:
    rec = load_one(make_backend("gpu", available=False, reason="no CUDA device found", device="cuda"))
    assert rec.status is BackendStatus.UNAVAILABLE
    assert (rec.reason, rec.device) == ("no CUDA device found", "cuda")
    assert rec.capabilities is not None


def test_unavailable_without_reason_still_explains(load_one, make_backend) -> None:
    rec = load_one(make_backend("mute", available=False))
    assert rec.status is BackendStatus.UNAVAILABLE and "without giving a reason" in rec.reason


def test_multi_line_reason_is_cut_to_one_line(load_one, make_backend) -> None:
    rec = load_one(make_backend("ml", available=False, reason="\n  first\nsecond"))
    assert rec.reason == "first"


def test_availability_raising(load_one, make_backend) -> None:
    rec = load_one(make_backend("bad", availability_error=OSError("libcuda.so: cannot open\nmore")))
    assert rec.status is BackendStatus.UNAVAILABLE
    assert rec.reason == "availability check raised OSError: libcuda.so: cannot open"


def test_capabilities_raising(load_one, make_backend) -> None:
    rec = load_one(make_backend("badcaps", capabilities_error=KeyError("head_sizes")))
    assert rec.status is BackendStatus.UNAVAILABLE
    assert rec.reason == "capabilities() raised KeyError: 'head_sizes'"


@pytest.mark.parametrize("version", [PLUGIN_API_VERSION + 1, PLUGIN_API_VERSION + 7, 0])
def test_api_version_mismatch_names_both_versions(load_one, make_backend, version) -> None:
    rec = load_one(make_backend("old", api_version=version))
    assert rec.status is BackendStatus.API_MISMATCH
    assert f"v{version}" in rec.reason and f"v{PLUGIN_API_VERSION}" in rec.reason


def test_api_mismatch_does_not_call_the_backend(load_one, make_backend) -> None:
    rec = load_one(make_backend("future", api_version=99, availability_error=AssertionError("called")))
    assert rec.status is BackendStatus.API_MISMATCH


def test_undeclared_api_version_is_a_load_error_saying_what_to_set(load_one, make_backend) -> None:
    cls = make_backend("implicit", availability_error=AssertionError("called"))
    del cls.api_version
    rec = load_one(cls)
    assert rec.status is BackendStatus.LOAD_ERROR
    assert "does not declare api_version" in rec.reason and f"api_version = {PLUGIN_API_VERSION}" in rec.reason


@pytest.mark.parametrize("value", ["1", 1.0, True])
def test_non_integer_api_version_is_an_api_mismatch(load_one, make_backend, value) -> None:
    rec = load_one(make_backend("odd", api_version=value))
    assert rec.status is BackendStatus.API_MISMATCH


def test_abstract_backend_is_a_load_error(load_one) -> None:
    class Half(AttentionBackend):
        name = "half"
        api_version = 1

    rec = load_one(Half)
    assert rec.status is BackendStatus.LOAD_ERROR
    assert "availability" in rec.reason and "write_kv" in rec.reason


@pytest.mark.parametrize("name", [None, "", "   ", 3])
def test_missing_or_bad_name_is_a_load_error_named_after_the_entry_point(load_one, make_backend, name) -> None:
    cls = make_backend("tmp")
    cls.name = name
    rec = load_one(cls)
    assert (rec.status, rec.name) == (BackendStatus.LOAD_ERROR, "single")
    assert "no valid 'name'" in rec.reason


def test_non_integer_priority_is_a_load_error(load_one, make_backend) -> None:
    cls = make_backend("prio")
    cls.priority = "high"
    rec = load_one(cls)
    assert rec.status is BackendStatus.LOAD_ERROR and "priority" in rec.reason


def test_availability_returning_junk(load_one, make_backend) -> None:
    cls = make_backend("junky")
    cls.availability = classmethod(lambda c: True)
    rec = load_one(cls)
    assert rec.status is BackendStatus.UNAVAILABLE
    assert "returned bool, expected Availability" in rec.reason


def test_capabilities_returning_junk(load_one, make_backend) -> None:
    cls = make_backend("junkcaps")
    cls.capabilities = classmethod(lambda c: {"dtypes": "all"})
    rec = load_one(cls)
    assert rec.status is BackendStatus.UNAVAILABLE
    assert "returned dict, expected BackendCapabilities" in rec.reason


def test_to_dict_is_json_ready(load_one, make_backend) -> None:
    rec = load_one(make_backend("js", priority=2))
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["status"] == "loaded" and data["priority"] == 2 and data["distribution"] == "dist-single"
    assert data["backend"].endswith("Fake_js") and data["capabilities"]["block_sizes"] == [16, 32]


def test_availability_with_reason_none_is_not_a_crash(load_one, make_backend) -> None:
    rec = load_one(make_backend("none-reason", available=False, reason=None))
    assert rec.status is BackendStatus.UNAVAILABLE and "without giving a reason" in rec.reason


def test_availability_with_unparseable_device_is_unavailable(load_one, make_backend) -> None:
    rec = load_one(make_backend("bad-device", device="not-a-device"))
    assert rec.status is BackendStatus.UNAVAILABLE and "not a torch device" in rec.reason


@pytest.mark.parametrize("where", ["availability_error", "capabilities_error"])
def test_sys_exit_in_a_class_method_only_breaks_that_backend(load_one, make_backend, where) -> None:
    rec = load_one(make_backend("exits", **{where: SystemExit(3)}))
    assert rec.status is BackendStatus.UNAVAILABLE and "SystemExit" in rec.reason
    if where == "capabilities_error":
        assert rec.reason.startswith("capabilities() raised")


def test_sys_exit_in_the_hook_only_breaks_that_plugin(plugins, make_backend) -> None:
    def exits() -> list[type[AttentionBackend]]:
        raise SystemExit(1)

    plugins.module("fake_exits", paged_register_backends=hookimpl(exits))
    plugins.module("fake_fine", paged_register_backends=hookimpl(lambda: [make_backend("fine")]))
    plugins.dist("dist-exits", exits="fake_exits")
    plugins.dist("dist-fine", fine="fake_fine")
    recs = {r.name: r for r in plugins.registry().records()}
    assert recs["exits"].status is BackendStatus.LOAD_ERROR and "SystemExit" in recs["exits"].reason
    assert recs["fine"].status is BackendStatus.LOADED
