"""Shared test options and the topology tiers' requirements.

`--backend` picks the shaping backend of the emulation tests. The topology tiers (tests/emulation,
tests/faults) need root, Mininet and the tools below; without them their tests are skipped with the
reason, and each of their tests checks that teardown left nothing behind.
"""

import needs
import pytest

TOPOLOGY_TIERS = ("tests/emulation", "tests/faults")


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default="auto",
        choices=("auto", "tc", "userspace"),
        help="shaping backend for tests/emulation (default: auto)",
    )


def _in_topology_tier(path) -> bool:
    return any(tier in str(path) for tier in TOPOLOGY_TIERS)


def _requirement_missing() -> str | None:
    return needs.missing("emulation tests", ("mnexec", "iperf3", "tcpdump", "tshark", "ethtool"))


def pytest_collection_modifyitems(config, items):
    reason = _requirement_missing()
    for item in items:
        if _in_topology_tier(item.fspath):
            item.add_marker(pytest.mark.emulation)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def backend(request) -> str:
    return request.config.getoption("--backend")


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    if not _in_topology_tier(request.node.fspath) or _requirement_missing():
        yield
        return
    assert _leftovers() == _nothing(), "a previous run left things behind: run `make clean`"
    yield
    assert _leftovers() == _nothing()


def _nothing() -> dict:
    from topology.cleanup import NOTHING

    return {**NOTHING, "containers": []}


def _leftovers() -> dict:
    """The topology's leftovers (topology.cleanup) and every container a run labelled as its own (the Docker
    runtime's roles and holders), running or not; none when no Docker engine answers."""
    from docker_rt import LABEL_RUN, DockerError
    from docker_rt.host import labelled
    from topology.cleanup import leftovers

    try:
        containers = sorted(c.name for c in labelled(LABEL_RUN))
    except DockerError:
        containers = []
    return {**leftovers(), "containers": containers}
