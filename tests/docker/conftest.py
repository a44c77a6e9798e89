"""Docker tier: needs root, Mininet and a Docker engine (installed and started on demand, as `make setup` does).

Every test that builds a topology checks that teardown left nothing: no
pdd- links, iptables rules, state files or recorded processes
(`topology.cleanup.leftovers`), and no container carrying the testbed's run
label. `test_builders.py` needs nothing and always runs.
"""

import needs
import pytest

from topology.cleanup import NOTHING, leftovers

NO_ROOT_FILES = ("test_builders.py",)


def requirement_missing() -> str | None:
    return needs.missing("Docker tests", ("mnexec",))


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: needs root, Mininet and a Docker engine")


def pytest_collection_modifyitems(config, items):
    reason = requirement_missing()
    for item in items:
        path = str(item.fspath)
        if "tests/docker" in path and not path.endswith(NO_ROOT_FILES):
            item.add_marker(pytest.mark.docker)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def labelled_containers() -> list[str]:
    from docker_rt import LABEL_RUN
    from docker_rt.engine import docker

    return docker(["ps", "-aq", "--filter", f"label={LABEL_RUN}"], quiet=True).stdout.split()


@pytest.fixture(scope="session")
def worker_image():
    """The worker image for the current tree (built on a fresh machine, cached after)."""
    from docker_rt import DockerError
    from docker_rt.image import ensure_image

    try:
        return ensure_image()
    except DockerError as exc:  # root and Mininet are here: a missing Docker is a real failure
        pytest.fail(f"no worker image: {exc}")


@pytest.fixture(scope="session")
def tiny_weights():
    """The tiny model's weights on the host: containers mount them read-only."""
    from workers.model import get_config, get_or_create_weights

    return get_or_create_weights(get_config("tiny"), 0)


@pytest.fixture
def nothing_left_behind(worker_image):
    from docker_rt.engine import ensure_running

    ensure_running()  # a test's `make clean` stops the engine the testbed started
    assert leftovers() == NOTHING, "a previous run left things behind: run `make clean`"
    assert labelled_containers() == [], "containers of an earlier run remain: run `make clean`"
    yield
    assert leftovers() == NOTHING
    ensure_running()  # containers are looked up with the engine up (make clean may have stopped it)
    assert labelled_containers() == []
