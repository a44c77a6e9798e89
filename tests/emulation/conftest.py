"""Emulation tier: needs root, Mininet and the topology; every test checks that teardown left nothing."""

import os
import shutil

import pytest

from topology.cleanup import NOTHING, leftovers


def _requirement_missing() -> str | None:
    if os.geteuid() != 0:
        return "emulation tests need root (namespaces, veth, tc)"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Mininet's Python library is missing (make setup installs it)"
    for tool in ("mnexec", "iperf3", "tcpdump", "tshark", "ethtool"):
        if not shutil.which(tool):
            return f"{tool} is missing (make setup installs it)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _requirement_missing()
    for item in items:
        if "tests/emulation" in str(item.fspath):
            item.add_marker(pytest.mark.emulation)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def backend(request) -> str:
    return request.config.getoption("--backend")


@pytest.fixture(autouse=True)
def nothing_left_behind():
    if _requirement_missing():
        yield
        return
    assert leftovers() == NOTHING, "a previous run left things behind: run `make clean`"
    yield
    assert leftovers() == NOTHING
