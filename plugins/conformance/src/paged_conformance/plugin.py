"""The pytest11 entry point of paged-conformance.

Inert unless ``--paged-backend`` is given: it only adds its options. With a
backend, :func:`pytest_configure` resolves it and registers a
:class:`~paged_conformance.session.ConformanceSession`, which holds every
hook that does anything.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the suite's modules import torch: only load them when the suite is active
    from paged_conformance.session import Conformance, ConformanceSession  # noqa: F401 - named in a string annotation

SESSION_KEY = pytest.StashKey["ConformanceSession"]()
PLUGIN_NAME = "paged-conformance-session"
GRIDS = ("quick", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options of the suite; all optional, so ordinary pytest runs are unaffected."""
    group = parser.getgroup("paged-conformance", "paged attention backend conformance")
    group.addoption(
        "--paged-backend",
        default=None,
        metavar="NAME",
        help="backend under test: a registered name or package.module:ClassName (activates the suite)",
    )
    group.addoption(
        "--paged-device",
        default=None,
        metavar="DEV",
        help="device to test on (default: the backend's); DEV-interpret (e.g. cpu-interpret) also "
        "sets TRITON_INTERPRET=1 before the backend loads",
    )
    group.addoption("--paged-grid", default="full", choices=GRIDS, help="grid size (default: full)")
    group.addoption(
        "--paged-oracle",
        default="auto",
        choices=("auto", "reference", "dense"),
        help="what outputs are compared against (auto: reference, dense when testing the reference)",
    )
    group.addoption("--paged-expect", default=None, metavar="FILE", help="TOML expectations (xfail/skip entries)")
    group.addoption("--paged-json", default=None, metavar="FILE", help="write the JSON report here")
    group.addoption(
        "--paged-strict", action="store_true", default=False, help="stale expectations are errors, not warnings"
    )


INTERPRET_SUFFIX = "-interpret"
"""``--device DEV-interpret`` (e.g. ``cpu-interpret``): test on ``DEV`` with ``TRITON_INTERPRET=1``."""


def split_device(device: str | None) -> tuple[str | None, bool]:
    """``(torch device, Triton interpreter requested)`` for a ``--device`` value."""
    if device and device.endswith(INTERPRET_SUFFIX):
        return device[: -len(INTERPRET_SUFFIX)] or "cpu", True
    return device, False


def pytest_configure(config: pytest.Config) -> None:
    """Activate the suite when a backend was named."""
    spec = config.getoption("paged_backend", None)
    if not spec:
        return
    device_opt, interpret = split_device(config.getoption("paged_device"))
    if interpret:
        # Triton fixes its mode when first imported (loading the backend may import it): set it first.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from paged_conformance.expectations import ExpectationsError, load_expectations
    from paged_conformance.loading import check_declarations, resolve_backend
    from paged_conformance.oracle import choose_oracle
    from paged_conformance.session import CAPABILITY_MARK, CASES_MARK, Conformance, ConformanceSession

    config.addinivalue_line("markers", f"{CASES_MARK}(family): parametrize from the backend's declared grid")
    config.addinivalue_line("markers", f"{CAPABILITY_MARK}(*names): report rows this test counts towards")
    try:
        info = resolve_backend(spec)
        avail = check_declarations(info)
        if not avail.available and device_opt is None:
            raise pytest.UsageError(f"backend {info.name!r} is not available here: {avail.reason}")
        device = torch.device(device_opt or avail.device)
        oracle = choose_oracle(info.cls, config.getoption("paged_oracle"))
        expect_path = config.getoption("paged_expect")
        expectations = load_expectations(expect_path) if expect_path else []
    except pytest.UsageError:
        raise
    except (ExpectationsError, ValueError, LookupError, RuntimeError) as exc:
        raise pytest.UsageError(f"paged-conformance: {exc}") from exc
    conf = Conformance(info=info, device=device, grid=config.getoption("paged_grid"), oracle=oracle)
    session = ConformanceSession(conf, expectations, config.getoption("paged_strict"), config.getoption("paged_json"))
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, PLUGIN_NAME)


@pytest.fixture(scope="session")
def conformance(request: pytest.FixtureRequest) -> Conformance:
    """The backend under test and the oracle (only inside a conformance run)."""
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.fail("the conformance fixture needs --paged-backend (run `paged-conformance run --backend NAME`)")
    conf: Conformance = session.conf
    return conf
